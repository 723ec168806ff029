// LayerNorm over the last dimension, eps 1e-5 (kernels/cpu/layernorm.h). One warp per row
// for the row-wise work; the weight and bias gradients are deterministic column sums over
// every row, whose first pass the backward kernel does as it goes (column_sum.cuh). The backward
// reads dout as a value of `store` (a GEMM's input gradient, which Ops::NarrowWritten leaves
// unrounded on this table).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "worker/engine/kernels/cuda/column_sum.cuh"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr unsigned kWarpsPerBlock = 8;
// The backward's blocks: rows each warp takes (a GPT-2 124M step at batch 32, N = 32768 and
// C = 768: 512 blocks of 8 warps, one wave of an H200 at 4 blocks an SM), and the shared
// memory a block may use without asking (its warps' sums).
constexpr int kRowsPerWarp = 8;
constexpr size_t kBackwardSharedBytes = 48 * 1024;

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void LayerNormForwardKernel(OperandOut out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float sum = 0;
  for (int c = lane; c < C; c += 32) sum += x[c];
  const float m = WarpSum(sum) / C;
  float var = 0;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    var += d * d;
  }
  const float s = rsqrtf(WarpSum(var) / C + kEps);
  const OperandOut o = out.At(static_cast<size_t>(row) * C);
  for (int c = lane; c < C; c += 32) o.Put(c, (x[c] - m) * s * weight[c] + bias[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// The same for a 16-bit out (a mixed-precision run's operand buffer) where C is a multiple of 8
// up to 256 kChunks and every row is 16-byte aligned: each lane loads its kChunks groups of 8
// columns (group lane + 32 i) once, in 16-byte words, keeps them in registers for the mean,
// the variance and the output, and stores each group's 8 outputs as one 16-byte word. The
// kernel above reads the row three times in 4-byte loads and stores 2 bytes at a time: 55 us a
// call at GPT-2 124M's N = 32768, C = 768 on an H200 (1.37 ms of a step), where its 150 MB
// (fp32 in, bf16 out) take 34 us at the memory's rate. Sums in another order than above's:
// the same values to float rounding, deterministic as they are.
template <typename H, int kChunks>
__global__ void LayerNormForwardWords(H* out, float* mean, float* rstd, const float* inp,
                                      const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float v[kChunks][kPerWord];
  float sum = 0;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = (lane + 32 * i) * kPerWord;
    if (c >= C) continue;
    LoadFloats<kPerWord>(x + c, v[i]);
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) sum += v[i][k];
  }
  const float m = WarpSum(sum) / C;
  float var = 0;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    if ((lane + 32 * i) * kPerWord >= C) continue;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      const float d = v[i][k] - m;
      var += d * d;
    }
  }
  const float s = rsqrtf(WarpSum(var) / C + kEps);
  H* y = out + static_cast<size_t>(row) * C;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = (lane + 32 * i) * kPerWord;
    if (c >= C) continue;
    float w[kPerWord], b[kPerWord];
    LoadFloats<kPerWord>(weight + c, w);
    LoadFloats<kPerWord>(bias + c, b);
    Word8<H> o;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) o.v[k] = ToNarrow<H>((v[i][k] - m) * s * w[k] + b[k]);
    o.Store(reinterpret_cast<uint4*>(y + c));
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// The most 8-column groups a lane of LayerNormForwardWords keeps (C up to 2048: GPT-2 XL's
// 1600 and every smaller one).
constexpr int kMostChunks = 8;

template <typename H, int kChunks = 1>
void LaunchForwardWords(H* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, cudaStream_t stream) {
  if constexpr (kChunks < kMostChunks) {
    if (C > 32 * kPerWord * kChunks) {
      LaunchForwardWords<H, kChunks + 1>(out, mean, rstd, inp, weight, bias, N, C, stream);
      return;
    }
  }
  const auto kernel = &LayerNormForwardWords<H, kChunks>;  // DROVER_LAUNCH is a macro
  DROVER_LAUNCH(kernel, Blocks(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream)
  (out, mean, rstd, inp, weight, bias, N, C);
}

// The backward in one pass over the rows, 16 bytes an element (inp, dout, and dinp read and
// written): each warp takes every warps-th row of its block's chunk of kRowsPerWarp * warps
// rows, adds the row's input gradient into dinp, and its dweight and dbias terms into the
// warp's own sums in shared memory (2 C floats; no other warp writes them, so no barrier until
// the end); the block then adds its warps' sums in warp order into its partials (dweight's in
// partial[block * C + c], dbias's gridDim.x * C further), and ColumnSumFinish adds the blocks'
// (column_sum.cuh). The first version had a kernel for dinp and then a column sum each for
// dweight and dbias, which read inp and dout twice more: 28 bytes an element.
// dinp (N, C) += the input gradient, stored in `store`; dout read in it, from floats or
// (G a 16-bit type) from an operand buffer the GEMM before wrote so, half the bytes. K: the
// columns a lane loads at once, 4 (float4; four 16-bit values in 8 bytes) where rows and
// weight are 16-byte aligned, else 1.
template <int K, typename G>
__device__ __forceinline__ void LoadGrads(const G* p, float (&g)[K]) {
  if constexpr (std::is_same_v<G, float>) {
    LoadFloats<K>(p, g);
  } else if constexpr (K == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    G v[4];
    memcpy(v, &raw, sizeof(raw));
#pragma unroll
    for (int k = 0; k < 4; ++k) g[k] = ToFloat(v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) g[k] = ToFloat(p[k]);
  }
}

// K values of dinp's sum into its 16-bit copy (H; void: no copy), 8 bytes a store where K is 4.
template <int K, typename H>
__device__ __forceinline__ void StoreCopy(H* p, const float (&d)[K]) {
  if constexpr (!std::is_void_v<H>) {
    H v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = ToNarrow<H>(d[k]);
    if constexpr (K == 4) {
      uint2 raw;
      memcpy(&raw, v, sizeof(raw));
      *reinterpret_cast<uint2*>(p) = raw;
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) p[k] = v[k];
    }
  }
}

// dinp_copy (H, not void): dinp's sum as a 16-bit operand buffer too, stored as it is written.
template <int K, typename G, typename H>
__global__ void LayerNormBackwardKernel(float* dinp, H* dinp_copy, float* partial, const G* dout,
                                        const float* inp, const float* weight, const float* mean,
                                        const float* rstd, int N, int C, Precision store) {
  DROVER_DYNAMIC_SHARED(shared);
  float* const sums = reinterpret_cast<float*>(shared);
  const int warps = static_cast<int>(blockDim.x / 32);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  float* const dw_sum = sums + static_cast<size_t>(warp) * 2 * C;
  float* const db_sum = dw_sum + C;
  // Each lane zeroes, adds to and (until the barrier) alone touches its own columns.
  for (int c = lane * K; c < C; c += 32 * K) {
    const float zero[K] = {};
    StoreFloats<K>(dw_sum + c, zero);
    StoreFloats<K>(db_sum + c, zero);
  }
  const int first = blockIdx.x * warps * kRowsPerWarp;
  const int end = min(N, first + warps * kRowsPerWarp);
  for (int row = first + warp; row < end; row += warps) {
    const size_t base = static_cast<size_t>(row) * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int c = lane * K; c < C; c += 32 * K) {
      float x[K], g[K], w[K], dw[K], db[K];
      LoadFloats<K>(inp + base + c, x);
      LoadGrads<K>(dout + base + c, g);
      LoadFloats<K>(weight + c, w);
      LoadFloats<K>(dw_sum + c, dw);
      LoadFloats<K>(db_sum + c, db);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float dy = Stored(g[k], store);
        const float norm = (x[k] - m) * s;
        const float dnorm = w[k] * dy;
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
        dw[k] += norm * dy;
        db[k] += dy;
      }
      StoreFloats<K>(dw_sum + c, dw);
      StoreFloats<K>(db_sum + c, db);
    }
    dnorm_mean = WarpSum(dnorm_mean) / C;
    dnorm_norm_mean = WarpSum(dnorm_norm_mean) / C;
    // The row again: its 2 C floats were read a moment ago, from the cache now.
    for (int c = lane * K; c < C; c += 32 * K) {
      float x[K], g[K], w[K], d[K];
      LoadFloats<K>(inp + base + c, x);
      LoadGrads<K>(dout + base + c, g);
      LoadFloats<K>(weight + c, w);
      LoadFloats<K>(dinp + base + c, d);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float norm = (x[k] - m) * s;
        const float dnorm = w[k] * Stored(g[k], store);
        d[k] = Stored(d[k] + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s, store);
      }
      StoreFloats<K>(dinp + base + c, d);
      if constexpr (!std::is_void_v<H>) StoreCopy<K>(dinp_copy + base + c, d);
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < 2 * C; j += blockDim.x) {
    float sum = sums[j];
    for (int v = 1; v < warps; ++v) sum += sums[static_cast<size_t>(v) * 2 * C + j];
    const unsigned chunk = j < C ? blockIdx.x : gridDim.x + blockIdx.x;
    partial[static_cast<size_t>(chunk) * C + j % C] = sum;
  }
}

// Warps of a backward block: as many as 8 whose sums fit the 48 KiB a block has by default.
int BackwardWarps(int C) {
  const size_t per_warp = 2 * sizeof(float) * static_cast<size_t>(C);
  return static_cast<int>(std::clamp<size_t>(kBackwardSharedBytes / per_warp, 1, 8));
}

int BackwardBlocks(int N, int C) {
  const int rows = BackwardWarps(C) * kRowsPerWarp;
  return (N + rows - 1) / rows;
}

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, Precision store, bool narrow_out,
                      cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && (!narrow_out || store != Precision::kFp32));
  const bool words = narrow_out && C % kPerWord == 0 && C <= 32 * kPerWord * kMostChunks &&
                     Aligned16(out) && Aligned16(inp) && Aligned16(weight) && Aligned16(bias);
  if (words && store == Precision::kBf16) {
    LaunchForwardWords(static_cast<__nv_bfloat16*>(static_cast<void*>(out)), mean, rstd, inp,
                       weight, bias, N, C, stream);
    DROVER_CUDA_LAUNCHED();
    return;
  }
  if (words) {
    LaunchForwardWords(static_cast<__half*>(static_cast<void*>(out)), mean, rstd, inp, weight, bias,
                       N, C, stream);
    DROVER_CUDA_LAUNCHED();
    return;
  }
  DROVER_LAUNCH(LayerNormForwardKernel, Blocks(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream)
  (OperandOut{out, narrow_out, store}, mean, rstd, inp, weight, bias, N, C);
  DROVER_CUDA_LAUNCHED();
}

size_t LayerNormBackwardScratch(int N, int C) {
  return 2 * static_cast<size_t>(BackwardBlocks(N, C)) * C;
}

void LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                       const float* dout, bool dout_narrow, const float* inp, const float* weight,
                       const float* mean, const float* rstd, int N, int C, bool accumulate,
                       Precision store, float* scratch, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && (!dout_narrow || store != Precision::kFp32));
  DROVER_CUDA_REQUIRE(dinp_copy == nullptr || store != Precision::kFp32);
  const int warps = BackwardWarps(C), blocks = BackwardBlocks(N, C);
  const size_t shared = 2 * sizeof(float) * static_cast<size_t>(C) * warps;
  const bool vector = C % 4 == 0 && Aligned16(dinp) && Aligned16(dout) && Aligned16(inp) &&
                      Aligned16(weight) && Aligned16(dinp_copy);
  // G: dout's type; H: the copy's (void: none).
  auto launch = [&](auto g, auto h) {
    using G = typename decltype(g)::type;
    using H = typename decltype(h)::type;
    const auto kernel =
        vector ? &LayerNormBackwardKernel<4, G, H> : &LayerNormBackwardKernel<1, G, H>;
    if (shared > kBackwardSharedBytes) {
      // C past 6144: one warp's sums need more than the default (sm_90 allows 227 KiB).
      DROVER_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(shared)));
    }
    DROVER_LAUNCH(kernel, blocks, warps * 32, shared, stream)
    (dinp, static_cast<H*>(static_cast<void*>(dinp_copy)), scratch,
     static_cast<const G*>(static_cast<const void*>(dout)), inp, weight, mean, rstd, N, C, store);
  };
  // N16: the 16-bit type of `store`, dout's where narrow and the copy's where asked.
  auto with_dout = [&](auto n) {
    using N16 = typename decltype(n)::type;
    auto with_copy = [&](auto g) {
      if (dinp_copy != nullptr) {
        launch(g, TypeTag<N16>{});
      } else {
        launch(g, TypeTag<void>{});
      }
    };
    if (dout_narrow) {
      with_copy(TypeTag<N16>{});
    } else {
      with_copy(TypeTag<float>{});
    }
  };
  if (store == Precision::kFp16) {
    with_dout(TypeTag<__half>{});
  } else {
    with_dout(TypeTag<__nv_bfloat16>{});  // fp32 too: dout floats, no copy (REQUIREd)
  }
  DROVER_CUDA_LAUNCHED();
  ColumnSumFinish(dweight, scratch, blocks, C, accumulate, stream);
  ColumnSumFinish(dbias, scratch + static_cast<size_t>(blocks) * C, blocks, C, accumulate, stream);
}

}  // namespace drover::engine::cuda
