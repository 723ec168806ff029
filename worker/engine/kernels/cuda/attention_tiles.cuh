// The tiles the fused attention kernels on mma.sync are built from (attention_mma.cu): 64-row
// tiles of q, k, v or dout in shared memory, row-major and padded (Tiles), loaded with
// cp.async (async_copy.cuh); a warp's fragments of them through ldmatrix (mma.cuh); the
// products of a warp's 16 rows with a tile, accumulated in registers in the PTX layout; and
// the row reductions and stores over those accumulators. Each tile sits in shared memory once:
// ldmatrix reads it in either orientation, plain where a product takes a row per B column (k
// for q k^T, v for dout v^T, q for k q^T, dout for v dout^T), transposed where it takes a row
// per k step (v for P v, dout for P^T dout, q for dS^T q, k for dS k). Rows are HS + 8
// elements apart: the 8 pad elements put the 8 rows an ldmatrix reads 16 bytes apart in the
// banks, so it has no conflicts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "worker/engine/kernels/cuda/async_copy.cuh"
#include "worker/engine/kernels/cuda/fused_attention.cuh"
#include "worker/engine/kernels/cuda/mma.cuh"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda::attention_tiles {

using fused::Align;
using fused::At;
using fused::kThreads;
using fused::kWarps;

constexpr int kKeys = fused::kTile;  // rows of a key tile, and of the backward's query tiles
constexpr int kBlocks = kKeys / 8;   // 8-column blocks of a 64-wide score tile
constexpr int kSteps = kKeys / 16;   // 16-deep k steps through 64 rows

// The strides (in 16-bit elements) and sizes (in bytes) of a head size's shared tiles.
template <int HS>
struct Tiles {
  static constexpr int kLd = HS + 8;
  static constexpr size_t Bytes(int rows) { return Align(2 * static_cast<size_t>(rows) * kLd); }
  static constexpr size_t kTile = Bytes(kKeys);
  static constexpr size_t kStats = Align(sizeof(float) * kKeys);
  // dk, dv: k, v, then q, dout, lse and D in each of two stages
  static constexpr size_t kDkv = 6 * kTile + 4 * kStats;
  // dq: q, dout, then k and v in each of two stages
  static constexpr size_t kDq = 6 * kTile;
};

// Rows [t0, t0 + kRows) of one head's (T, HS) slice of `src` (rows ld elements apart, src at
// row 0 of the slice) into a row-major shared tile as N; rows past T are zeros. A 16-bit
// source is copied asynchronously (the caller commits and waits: async_copy.cuh); a float
// one (DROVER_CUDA_GEMM_INPUTS=fp32) is read, rounded to N and stored now. Eight elements a
// thread at a time along the rows: a warp reads whole rows, coalesced.
template <typename N, int HS, int kRows>
__device__ void LoadTile(N* tile, OperandIn src, size_t ld, int t0, int T) {
  constexpr int kVecs = HS / 8;
  for (int e = threadIdx.x; e < kRows * kVecs; e += kThreads) {
    const int r = e / kVecs, c = (e % kVecs) * 8;
    const bool in = t0 + r < T;
    const size_t at = static_cast<size_t>(in ? t0 + r : 0) * ld + c;  // row 0: mapped
    N* dst = tile + r * Tiles<HS>::kLd + c;
    if (src.narrow) {
      CopyAsync<16>(dst, static_cast<const N*>(src.data) + at, in);
      continue;
    }
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (in) {
      const float* f = static_cast<const float*>(src.data) + at;
      const float4 lo = *reinterpret_cast<const float4*>(f);
      const float4 hi = *reinterpret_cast<const float4*>(f + 4);
      w[0] = PackNarrow<N>(lo.x, lo.y), w[1] = PackNarrow<N>(lo.z, lo.w);
      w[2] = PackNarrow<N>(hi.x, hi.y), w[3] = PackNarrow<N>(hi.z, hi.w);
    }
    *reinterpret_cast<uint4*>(dst) = uint4{w[0], w[1], w[2], w[3]};
  }
}

// kKeys floats of row statistics (lse or D of one head, from element t0) into shared memory
// asynchronously, zeros past T.
__device__ __forceinline__ void LoadStats(float* dst, const float* src, int t0, int T) {
  for (int r = threadIdx.x; r < kKeys; r += kThreads) {
    const bool in = t0 + r < T;
    CopyAsync<4>(dst + r, src + (in ? t0 + r : 0), in);
  }
}

// A warp's A fragment of k step kk from 16 rows of a row-major tile (`rows` at its first
// row): matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are a[0..3].
template <typename N, int HS>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const N* rows, int kk) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4<false>(a, rows + (lane % 16) * Tiles<HS>::kLd + kk * 16 + (lane / 16) * 8);
}

// The B fragments of two 8-column blocks, columns n0..n0 + 15, at k step k0..k0 + 15, from a
// tile that holds one row per column (B(k, n) = X[n][k]): b[0..1] for columns n0.., b[2..3]
// for n0 + 8...
template <typename N, int HS>
__device__ __forceinline__ void LoadBByRows(uint32_t (&b)[4], const N* x, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4<false>(
      b, x + (n0 + lane % 8 + (lane / 16) * 8) * Tiles<HS>::kLd + k0 + ((lane / 8) % 2) * 8);
}

// The same from a tile that holds one row per k step (B(k, n) = X[k][n]), transposed by
// ldmatrix.
template <typename N, int HS>
__device__ __forceinline__ void LoadBByCols(uint32_t (&b)[4], const N* x, int n0, int k0) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4<true>(
      b, x + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * Tiles<HS>::kLd + n0 + (lane / 16) * 8);
}

// The A fragment of a 16-deep k step made of two adjacent 8-column accumulator blocks (lo:
// columns 0-7 of the step, hi: 8-15; mma.cuh): a product's output as the next product's
// input, narrowed to N.
template <typename N>
__device__ __forceinline__ void AccumulatorsAsA(uint32_t (&a)[4], const float (&lo)[4],
                                                const float (&hi)[4]) {
  a[0] = PackNarrow<N>(lo[0], lo[1]);
  a[1] = PackNarrow<N>(lo[2], lo[3]);
  a[2] = PackNarrow<N>(hi[0], hi[1]);
  a[3] = PackNarrow<N>(hi[2], hi[3]);
}

// One 16-deep k step kk of ScoresProduct: x += A B over the pairs [p0, p1), a[i] tile i's A
// fragment of the step.
template <typename N, int HS, int kTiles, int kNB>
__device__ __forceinline__ void ScoresStep(float (&x)[kTiles][kNB][4],
                                           const uint32_t (&a)[kTiles][4], const N* x_rows, int kk,
                                           int p0, int p1) {
#pragma unroll
  for (int p = 0; p < kNB / 2; ++p) {
    if (p < p0 || p >= p1) continue;
    uint32_t b[4];
    LoadBByRows<N, HS>(b, x_rows, p * 16, kk * 16);
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      Mma16816<N>(x[i][2 * p], a[i], {b[0], b[1]});
      Mma16816<N>(x[i][2 * p + 1], a[i], {b[2], b[3]});
    }
  }
}

// x (kTiles 16-row tiles) += A B over the first 16 `columns` of each 16-column pair
// (pairs [p0, kBlocks / 2)): A the warp's rows as fragments a[tile][HS / 16], B(k, n) =
// X[n][k] from `x_rows` (a tile holding one row per column of the product): S = q k^T,
// dP = dout v^T, S^T = k q^T, dP^T = v dout^T.
template <typename N, int HS, int kTiles, int kNB>
__device__ __forceinline__ void ScoresProduct(float (&x)[kTiles][kNB][4],
                                              const uint32_t (&a)[kTiles][HS / 16][4],
                                              const N* x_rows, int p0, int p1) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t step[kTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int r = 0; r < 4; ++r) step[i][r] = a[i][kk][r];
    }
    ScoresStep<N, HS, kTiles, kNB>(x, step, x_rows, kk, p0, p1);
  }
}

// ScoresProduct with A read from a shared tile a k step at a time (`a_rows` at the warp's
// first row, its kTiles 16-row tiles one after the other) rather than held in registers: a
// k step's fragments are all of A that is live, which leaves a forward with 32 rows and 128
// keys a warp the registers it needs without spilling.
template <typename N, int HS, int kTiles, int kNB>
__device__ __forceinline__ void ScoresProductFromShared(float (&x)[kTiles][kNB][4], const N* a_rows,
                                                        const N* x_rows, int p0, int p1) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t step[kTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) LoadA<N, HS>(step[i], a_rows + i * 16 * Tiles<HS>::kLd, kk);
    ScoresStep<N, HS, kTiles, kNB>(x, step, x_rows, kk, p0, p1);
  }
}

// x += A1 B1 and y += A2 B2 as ScoresProduct does for one 16-row tile, with A1 and A2 read
// from shared tiles (a1, a2 at the warp's first row) a k step at a time rather than held in
// registers: the backward kernels' accumulators leave no room for them, at the occupancy
// their launch bounds ask for (or at all, at HS = 128).
template <typename N, int HS>
__device__ __forceinline__ void TwoScoresProducts(float (&x)[1][kBlocks][4],
                                                  float (&y)[1][kBlocks][4], const N* a1,
                                                  const N* a2, const N* b1, const N* b2, int p0,
                                                  int p1) {
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t a1f[1][1][4], a2f[1][1][4];
    LoadA<N, HS>(a1f[0][0], a1, kk);
    LoadA<N, HS>(a2f[0][0], a2, kk);
#pragma unroll
    for (int p = 0; p < kBlocks / 2; ++p) {
      if (p < p0 || p >= p1) continue;
      uint32_t f1[4], f2[4];
      LoadBByRows<N, HS>(f1, b1, p * 16, kk * 16);
      LoadBByRows<N, HS>(f2, b2, p * 16, kk * 16);
      Mma16816<N>(x[0][2 * p], a1f[0][0], {f1[0], f1[1]});
      Mma16816<N>(x[0][2 * p + 1], a1f[0][0], {f1[2], f1[3]});
      Mma16816<N>(y[0][2 * p], a2f[0][0], {f2[0], f2[1]});
      Mma16816<N>(y[0][2 * p + 1], a2f[0][0], {f2[2], f2[3]});
    }
  }
}

// acc += X B through k steps [kk0, kk1) of the 64-deep product: X a warp's 16 x 64
// accumulators per tile, narrowed to N as the A operand; B(k, n) = X[k][n] from `cols` (a
// tile holding one row per k step): o += P v, dq += dS k, dv += P^T dout, dk += dS^T q.
template <typename N, int HS, int kTiles, int kNB>
__device__ __forceinline__ void AccumulateProduct(float (&acc)[kTiles][HS / 8][4],
                                                  const float (&x)[kTiles][kNB][4], const N* cols,
                                                  int kk0, int kk1) {
#pragma unroll
  for (int kk = 0; kk < kNB / 2; ++kk) {
    if (kk < kk0 || kk >= kk1) continue;
    uint32_t a[kTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) AccumulatorsAsA<N>(a[i], x[i][2 * kk], x[i][2 * kk + 1]);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      uint32_t b[4];
      LoadBByCols<N, HS>(b, cols, n * 16, kk * 16);
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        Mma16816<N>(acc[i][2 * n], a[i], {b[0], b[1]});
        Mma16816<N>(acc[i][2 * n + 1], a[i], {b[2], b[3]});
      }
    }
  }
}

// The sum (or max) of a value over the 4 lanes that hold one row of an accumulator.
__device__ __forceinline__ float RowSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float RowMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// The max or the sum of the 16 values a lane holds of one row of a 16 x 64 accumulator
// (half r: elements 2r and 2r + 1 of each 8-column block) as a balanced tree: four levels of
// independent operations, where a running max or sum would chain 16 dependent ones, each
// waiting out the last's latency with few other warps to issue meanwhile.
struct MaxOf {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOf {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
template <int kNB, typename Op>
__device__ __forceinline__ float RowReduce(const float (&x)[kNB][4], int r, Op op) {
  float v[kNB];
#pragma unroll
  for (int j = 0; j < kNB; ++j) v[j] = op(x[j][2 * r], x[j][2 * r + 1]);
#pragma unroll
  for (int w = kNB / 2; w > 0; w /= 2) {
#pragma unroll
    for (int j = 0; j < w; ++j) v[j] = op(v[j], v[j + w]);
  }
  return v[0];
}

// A warp's 16 x HS accumulators (rows from `row`, channels from 0) into dst (row stride ld
// elements, dst at row 0 and channel 0 of the head's slice), rows < T only.
template <int HS>
__device__ __forceinline__ void StoreRows(OperandOut dst, size_t ld, int row, int T,
                                          const float (&acc)[HS / 8][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int n = 0; n < HS / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = row + g + (e / 2) * 8;
      if (r < T) dst.Put(static_cast<size_t>(r) * ld + n * 8 + 2 * t + e % 2, acc[n][e]);
    }
  }
}

// acc *= x: a warp's 16 x HS accumulators scaled once at the end, where a factor common to
// every term (the softmax scale of dq and dk) left the products' inputs for it.
template <int HS>
__device__ __forceinline__ void ScaleAccumulators(float (&acc)[HS / 8][4], float x) {
#pragma unroll
  for (int n = 0; n < HS / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] *= x;
  }
}

// The 16-column pairs of a key tile (of `pairs` pairs) from k0 that rows up to `last` see:
// all of them off the diagonal, fewer on it (the keys past the warp's last row are masked
// whole: skipped).
__device__ __forceinline__ int PairsSeen(int k0, int last, int pairs) {
  return min(pairs, (last - k0) / 16 + 1);
}

}  // namespace drover::engine::cuda::attention_tiles
