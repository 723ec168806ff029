// The plugin's device memory (device_memory.h).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "common/mutex.h"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/device_memory.h"

namespace drover::engine::cuda {

namespace {
std::atomic<uint64_t> g_device_allocations{0};

// The bytes each live allocation holds, their sum and its largest value so far.
struct DeviceBytes {
  Mutex mu;
  std::map<const void*, size_t> sizes GUARDED_BY(mu);
  uint64_t held GUARDED_BY(mu) = 0;
  uint64_t peak GUARDED_BY(mu) = 0;
};
DeviceBytes g_device_bytes;
}  // namespace

cudaError_t CountedMalloc(void** p, size_t bytes) {
  g_device_allocations.fetch_add(1, std::memory_order_relaxed);
  const cudaError_t err = cudaMalloc(p, bytes);
  if (err == cudaSuccess) {
    MutexLock lock(&g_device_bytes.mu);
    g_device_bytes.sizes[*p] = bytes;
    g_device_bytes.held += bytes;
    g_device_bytes.peak = std::max(g_device_bytes.peak, g_device_bytes.held);
  }
  return err;
}

cudaError_t CountedFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  {
    MutexLock lock(&g_device_bytes.mu);
    auto it = g_device_bytes.sizes.find(p);
    DROVER_CUDA_REQUIRE(it != g_device_bytes.sizes.end());  // not from CountedMalloc
    g_device_bytes.held -= it->second;
    g_device_bytes.sizes.erase(it);
  }
  return cudaFree(p);
}

namespace {
std::string Bytes(size_t n) {
  char text[32];
  if (n >= (size_t{1} << 30)) {
    std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(n) / (1 << 30));
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(n) / (1 << 20));
  }
  return text;
}
}  // namespace

// A job too large for its GPU is bad input, not a broken invariant: no abort and core dump,
// but one line that names the problem and the settings that shrink a rank's share, the last
// line of the trainer's log, which the agent reports as the failure. Exit 1, not 2 (input to
// fix, never retried): the coordinator's restart may run the job at another world size, where
// a rank's share differs, or the memory may have been another process's.
void* DeviceMallocOrExit(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = CountedMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) free = total = 0;
    std::fprintf(stderr,
                 "out of GPU memory: %s more was needed and the GPU has %s free of %s. A rank "
                 "needs less with a smaller train.micro_batch (gradient accumulation keeps "
                 "train.global_batch), train.recompute: all (activations recomputed in "
                 "backward), parallel.zero_stage 1-3, or more ranks\n",
                 Bytes(bytes).c_str(), Bytes(free).c_str(), Bytes(total).c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  DROVER_CUDA_CHECK(err);
  return p;
}

float* DeviceAllocator::Allocate(size_t n) {
  if (n == 0) return nullptr;
  void* p = DeviceMallocOrExit(n * sizeof(float));
  DROVER_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  DROVER_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return static_cast<float*>(p);
}

void DeviceAllocator::Free(float* p) { DROVER_CUDA_CHECK(CountedFree(p)); }

float* PinnedAllocator::Allocate(size_t n) {
  if (n == 0) return nullptr;
  void* p = nullptr;
  DROVER_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(float)));
  std::memset(p, 0, n * sizeof(float));
  return static_cast<float*>(p);
}

void PinnedAllocator::Free(float* p) {
  if (p != nullptr) DROVER_CUDA_CHECK(cudaFreeHost(p));
}

uint64_t DeviceAllocationCount() { return g_device_allocations.load(std::memory_order_relaxed); }

DeviceMemoryUse DeviceMemoryNow() {
  MutexLock lock(&g_device_bytes.mu);
  return {g_device_bytes.held, g_device_bytes.peak};
}

}  // namespace drover::engine::cuda
