// What every CUDA op file shares: the stream the backend runs on and grid sizing. One
// compute stream per process (a trainer drives one GPU); every op is enqueued on it in
// program order, so ops need no events between them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

// Every kernel launch: DROVER_LAUNCH(Kernel, grid, block, shared_bytes, stream)(args...).
// Under nvcc it is the triple-chevron launch; the kernel emulator (tests/cuda_emu/) compiles
// these files as plain C++ with its own definition, to run every kernel on the CPU.
#ifndef DROVER_LAUNCH
#define DROVER_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  kernel<<<grid, block, shared_bytes, stream>>>
#endif

// A kernel's dynamic shared memory (the launch's shared_bytes) as `unsigned char* name`,
// 128-byte aligned; the emulator gives each block its own.
#ifndef DROVER_DYNAMIC_SHARED
#define DROVER_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace drover::engine::cuda {

inline unsigned Blocks(size_t n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// A grid-stride loop's grid: enough blocks to fill the GPU, not one per element.
inline unsigned StrideBlocks(size_t n, unsigned threads) {
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 8 ? (blocks == 0 ? 1 : blocks) : 65535 * 8);
}

// A type as a value, to pick a kernel's instantiation in a generic lambda (the plugin's
// sources are C++17: no std::type_identity).
template <typename T>
struct TypeTag {
  using type = T;
};

// The largest dynamic shared memory a block of this device may opt in to; 0 when it cannot
// be asked (then the kernels that need more than the default are not used). One device per
// process: asked once.
inline size_t SharedOptIn() {
  static const size_t opt_in = [] {
    int device = 0, value = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
            cudaSuccess) {
      (void)cudaGetLastError();  // not sticky; the GEMMs need no such limit
      return size_t{0};
    }
    return static_cast<size_t>(value);
  }();
  return opt_in;
}

}  // namespace drover::engine::cuda
