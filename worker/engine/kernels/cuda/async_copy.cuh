// Copies from global to shared memory that the kernel does not wait for at the load (PTX's
// cp.async, sm_80 and later): a block issues the next tile's copies, computes on the tile it
// has, and waits only when it needs the next one, so the loads' latency hides behind the
// tensor cores' work instead of stalling every warp at each tile. The kernel emulator
// (tests/cuda_emu/) lands a copy only at the wait that covers it, so a tile read without its
// wait reads stale data there, as it may on the device.
#pragma once

#include <cstdint>

namespace drover::engine::cuda {

// kBytes (4, 8 or 16) from global `src` into shared `dst`, both aligned to kBytes, or zeros
// where `valid` is false (src is then not read; pass any mapped address). 16 bytes go
// through L2 only (.cg: a tile read once per block); smaller copies are .ca, as PTX requires.
template <int kBytes>
__device__ __forceinline__ void CopyAsync(void* dst, const void* src, bool valid) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16);
#if defined(__CUDA_ARCH__)
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src),
                 "r"(valid ? 16 : 0));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(at), "l"(src), "n"(kBytes),
                 "r"(valid ? kBytes : 0));
  }
#elif !defined(__CUDACC__)
  ::drover_emu::CpAsync(dst, src, kBytes, valid ? kBytes : 0);
#endif
}

// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void CommitCopies() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif !defined(__CUDACC__)
  ::drover_emu::CpAsyncCommit();
#endif
}

// Waits until all but the newest kPending of this thread's committed groups have landed.
// Other threads see them only after a __syncthreads that follows their own waits.
template <int kPending>
__device__ __forceinline__ void WaitCopies() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#elif !defined(__CUDACC__)
  ::drover_emu::CpAsyncWait(kPending);
#endif
}

}  // namespace drover::engine::cuda
