// What the two fused attention implementations share (flash_attention.cu on wmma tiles,
// attention_mma.cu on mma.sync register tiles): the grid of 64-row tiles, the shapes they
// assume, the launch with more than 48 KiB of shared memory, and the first backward pass.
// Both keep the same state for backward (FlashAttentionStateFloats: each row's log-sum-exp)
// and read the forward's out, so either backward reads what either forward kept.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda::fused {

constexpr int kTile = 64;  // rows of a query or key tile: one block's
constexpr int kWarps = kTile / 16;
constexpr int kThreads = kWarps * 32;

// The start of a shared-memory region of `bytes` rounded up to 128 bytes.
constexpr size_t Align(size_t bytes) { return (bytes + 127) / 128 * 128; }

template <typename T>
__device__ __forceinline__ T* At(unsigned char* smem, size_t offset) {
  return reinterpret_cast<T*>(smem + offset);
}

// Whether the fused kernels are built for head size `hs`.
constexpr bool FusedHeadSize(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 128; }

// fn(std::integral_constant<int, HS>{}) for the head size hs (FusedHeadSize checked): the
// kernels' instantiation for the run's head size.
template <typename Fn>
auto ForHeadSize(int hs, Fn&& fn) {
  switch (hs) {
    case 16:
      return fn(std::integral_constant<int, 16>{});
    case 32:
      return fn(std::integral_constant<int, 32>{});
    case 64:
      return fn(std::integral_constant<int, 64>{});
    default:
      return fn(std::integral_constant<int, 128>{});
  }
}

// TypeTag and SharedOptIn live in launch.h: every op file may take them.
using cuda::SharedOptIn;
using cuda::TypeTag;

// fn(TypeTag<N>{}, std::integral_constant<int, HS>{}) for the run's 16-bit type N (bf16, or
// fp16) and its head size (FusedHeadSize checked): the instantiation a launcher takes.
template <typename Fn>
void ForKernel(Precision operands, int hs, Fn&& fn) {
  ForHeadSize(hs, [&](auto h) {
    if (operands == Precision::kBf16) {
      fn(TypeTag<__nv_bfloat16>{}, h);
    } else {
      fn(TypeTag<__half>{}, h);
    }
  });
}

// One block per 64-row tile of one (b, h): x the tiles, y the B * NH heads.
inline dim3 Grid(int B, int T, int NH) {
  return dim3(static_cast<unsigned>((T + kTile - 1) / kTile), static_cast<unsigned>(B * NH));
}

// What the kernels assume of the shapes and buffers: rows of qkv and dout load 16 bytes at a
// time (float4, or eight 16-bit values).
inline void RequireShapes(const float* qkv, const float* dout, int B, int T, int C, int NH) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && NH > 0 && C % NH == 0);
  DROVER_CUDA_REQUIRE(static_cast<long long>(B) * NH <= 65535);
  DROVER_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(qkv) % 16 == 0);
  DROVER_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(dout) % 16 == 0);
}

// Launches `kernel` (kThreads threads a block) with `bytes` of dynamic shared memory, raising
// its limit past the default 48 KiB first (cheap, and idempotent).
template <typename... P, typename... A>
void LaunchWithShared(void (*kernel)(P...), dim3 grid, size_t bytes, cudaStream_t stream,
                      const A&... args) {
  DROVER_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
  DROVER_LAUNCH(kernel, grid, kThreads, bytes, stream)(args...);
  DROVER_CUDA_LAUNCHED();
}

// D (B, NH, T) = sum over the head's channels of dout (as N rounds it) * out, out as the
// forward stored it (an operand buffer: 16-bit where the run's are): softmax's backward needs
// sum_j P_ij dP_ij, which equals it, as FlashAttention takes it. The forward kept an fp32
// copy of out for this before: 4 bytes an element more written by the forward and read
// here, and B*T*C floats of state a layer (1.2 GB at GPT-2 124M, batch 32), for a D closer
// to the CPU's by a rounding of out (the device check's attention tolerance holds either).
// dout is floats (G = float) or 16-bit already (G = N: the projection's GEMM wrote it so).
// Where dout_n is given (floats only), dout narrowed to N (B, T, C) too, in the same pass:
// what the mma kernels' tiles copy (attention_mma.cu). One warp per (b, t, h), two adjacent
// channels a lane: an 8-byte (or 4-byte) load of dout (16-byte aligned, RequireShapes; the
// head's offset and the channel are even).
template <typename N, int HS, typename G>
__global__ void SoftmaxDotKernel(float* D, N* dout_n, const G* dout, OperandIn out, int B, int T,
                                 int C, int NH) {
  const size_t rows = static_cast<size_t>(B) * T * NH;
  const size_t row = (blockIdx.x * size_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const size_t bt = row / NH;
  const int h = static_cast<int>(row % NH);
  const size_t at = bt * C + h * HS;
  float sum = 0.0f;
  for (int d = 2 * lane; d < HS; d += 64) {
    N lo, hi;
    if constexpr (std::is_same_v<G, float>) {
      const float2 x = *reinterpret_cast<const float2*>(dout + at + d);
      lo = ToNarrow<N>(x.x), hi = ToNarrow<N>(x.y);
    } else {
      static_assert(std::is_same_v<G, N>);
      lo = dout[at + d], hi = dout[at + d + 1];
    }
    if (dout_n != nullptr) {
      dout_n[at + d] = lo;
      dout_n[at + d + 1] = hi;
    }
    sum += ToFloat(lo) * out.Get(at + d) + ToFloat(hi) * out.Get(at + d + 1);
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const size_t b = bt / T, t = bt % T;
  if (lane == 0) D[(b * NH + h) * T + t] = sum;
}

// D as SoftmaxDotKernel computes it where dout and out are both 16-bit (the mixed-precision
// runs': the projection's GEMM wrote dout so, the forward stored out so): a lane reads one
// 16-byte word (8 channels) of each, HS / 8 lanes a row, so a warp does 256 / HS rows (4 at
// HS = 64) where the kernel above gave each row a warp and each lane 4 bytes of each. Words
// are 16-byte aligned: C and HS are multiples of 8 (FusedHeadSize), the buffers 16-byte
// aligned (the launcher checks).
template <typename N, int HS>
__global__ void SoftmaxDotWordsKernel(float* D, const N* dout, const N* out, int B, int T, int C,
                                      int NH) {
  constexpr int kLanesPerRow = HS / kPerWord;
  static_assert(kLanesPerRow >= 1 && kLanesPerRow <= 32 && 32 % kLanesPerRow == 0);
  const size_t rows = static_cast<size_t>(B) * T * NH;
  const size_t thread = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  const size_t row = thread / kLanesPerRow;
  const int part = static_cast<int>(thread % kLanesPerRow);
  // Every lane of a warp takes part in the shuffles: a row past the end sums zeros.
  float sum = 0.0f;
  size_t b = 0, t = 0;
  int h = 0;
  if (row < rows) {
    const size_t bt = row / NH;
    h = static_cast<int>(row % NH);
    b = bt / T, t = bt % T;
    const size_t at = bt * C + h * HS + part * kPerWord;
    const Word8<N> dy = Word8<N>::Load(reinterpret_cast<const uint4*>(dout + at));
    const Word8<N> y = Word8<N>::Load(reinterpret_cast<const uint4*>(out + at));
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) sum += ToFloat(dy.v[k]) * ToFloat(y.v[k]);
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (row < rows && part == 0) D[(b * NH + h) * T + t] = sum;
}

// Launches SoftmaxDotKernel: dot = D from dout (floats, or N) and out, and dout_n (may be
// null; floats only) = dout narrowed; SoftmaxDotWordsKernel where dout and out are 16-bit
// and 16-byte aligned.
template <typename N, int HS, typename G>
void SoftmaxDot(float* dot, N* dout_n, const G* dout, OperandIn out, int B, int T, int C, int NH,
                cudaStream_t stream) {
  const size_t rows = static_cast<size_t>(B) * T * NH;
  constexpr unsigned kDotThreads = 256;
  if constexpr (std::is_same_v<G, N> && HS % kPerWord == 0) {
    if (out.narrow && Aligned16(dout) && Aligned16(out.data) && C % kPerWord == 0) {
      auto* kernel = &SoftmaxDotWordsKernel<N, HS>;
      DROVER_LAUNCH(kernel, Blocks(rows * (HS / kPerWord), kDotThreads), kDotThreads, 0, stream)
      (dot, dout, static_cast<const N*>(out.data), B, T, C, NH);
      DROVER_CUDA_LAUNCHED();
      return;
    }
  }
  auto* kernel = &SoftmaxDotKernel<N, HS, G>;
  DROVER_LAUNCH(kernel, Blocks(rows * 32, kDotThreads), kDotThreads, 0, stream)
  (dot, dout_n, dout, out, B, T, C, NH);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda::fused
