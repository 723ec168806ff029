// The plugin's device memory: every cudaMalloc counted (Ops::device_allocations and
// Ops::device_bytes), a job too large for its GPU told so in one line, and the kernel table's
// two allocators (kernels/ops.h: Ops::allocator, Ops::host_allocator).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "worker/engine/kernels/ops.h"

namespace drover::engine::cuda {

// cudaMalloc and cudaFree, counted: every device allocation of the plugin goes through the
// first, and every free of one through the second. Any thread.
cudaError_t CountedMalloc(void** p, size_t bytes);
cudaError_t CountedFree(void* p);

// CountedMalloc for the training's buffers (arenas, activations, scratch). When the GPU has
// no room the process says so, with what it asked for, what the GPU has left and what makes
// a rank need less, and exits 1; any other error is a CudaFail.
void* DeviceMallocOrExit(size_t bytes);

// CountedMalloc's calls so far, and the bytes its live allocations hold now and at most so far.
uint64_t DeviceAllocationCount();
struct DeviceMemoryUse {
  uint64_t held = 0, peak = 0;
};
DeviceMemoryUse DeviceMemoryNow();

// Device memory, zero-filled on `stream` (and waited for) before Allocate returns.
class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(cudaStream_t stream) : stream_(stream) {}
  float* Allocate(size_t n) override;
  void Free(float* p) override;

 private:
  cudaStream_t stream_;
};

// Page-locked host memory, zero-filled.
class PinnedAllocator final : public Allocator {
 public:
  float* Allocate(size_t n) override;
  void Free(float* p) override;
};

}  // namespace drover::engine::cuda
