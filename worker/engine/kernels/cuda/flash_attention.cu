// Causal multi-head attention over packed qkv (kernels/cpu/attention.h) for mixed-precision
// runs, fused in the manner of FlashAttention: the (T, T) scores live only as 16 x 64 tiles
// in shared memory, the masked half is never computed, and what forward keeps for backward
// is each row's log-sum-exp, B*NH*T floats instead of the B*NH*T*T probabilities
// (FlashAttentionStateFloats); backward reads the forward's out besides.
//
// The products run on tensor cores through the warp matrix functions (wmma), in the same
// formats the GEMM version (attention.cu) gives cuBLAS, so both give the same numbers up to
// summation order:
//   scores  S = q k^T        bf16 / fp16 operands (they hold values of the run's precision)
//   dP = dout v^T            bf16 / fp16
//   out = P v, dv = P^T dout, dq = dS k, dk = dS^T q     TF32 (P and dS are fp32 values)
// with fp32 accumulation, and the softmax, its online rescaling and its gradient in fp32.
//
// Work: 64-row tiles; a block of 4 warps owns a tile of one (b, h), each warp 16 of its rows.
//   forward: a block per query tile walks the key tiles up to the diagonal, keeping the row
//            max m, the row sum l and the unnormalised output in shared memory (the output
//            is rescaled by exp(m_old - m_new) per row, which wmma's opaque accumulator layout
//            does not allow in registers), and writes out = o / l and lse = m + log l.
//   D:       D = rowsum(dout * out) per row, from out as the forward stored it (softmax's
//            backward needs sum_j P_ij dP_ij, which equals it).
//   dq:      a block per query tile walks the key tiles up to the diagonal, recomputing P
//            from lse, dS = P (dP - D) scale, and accumulates dq = dS k in registers.
//   dk, dv:  a block per key tile walks the query tiles from the diagonal on, recomputing
//            P^T and dS^T, and accumulates dv = P^T dout and dk = dS^T q in registers.
// Every element of dqkv is written exactly once, with no atomics: the backward is
// deterministic (at the price of computing S and dP twice, once per backward kernel).
//
// Only mixed-precision runs with a head size of 16, 32, 64 or 128 come here
// (FlashAttentionApplies); fp32 runs keep the GEMM version, whose pedantic fp32 products are
// the CPU reference's arithmetic.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/fused_attention.cuh"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using fused::Align;
using fused::At;
using fused::Grid;
using fused::kThreads;
using fused::kTile;
using fused::kWarps;
using fused::LaunchWithShared;
using fused::RequireShapes;

// An output element as the run stores it (ops.h: out and dqkv are stored in `operands`).
template <typename N>
__device__ __forceinline__ float Stored(float x) {
  return ToFloat(ToNarrow<N>(x));
}

__device__ __forceinline__ float Tf32(float x) { return wmma::__float_to_tf32(x); }

// The shared-memory layout of each kernel, in bytes from the (128-byte aligned) base; every
// region starts 128-byte aligned (Align), and row strides are padded against bank conflicts
// while keeping wmma's rules (16-byte multiples; 32-byte aligned tiles at 8- and 16-row steps).

template <typename N, int HS>
struct Geometry {
  static constexpr int kLdN = HS + 8;                         // narrowed tiles
  static constexpr int kLdF = HS + 4;                         // fp32 / tf32 tiles
  static constexpr int kLdW = (HS > kTile ? HS : kTile) + 4;  // a warp's 16-row tile
  static constexpr size_t kNarrowTile = Align(sizeof(N) * kTile * kLdN);
  static constexpr size_t kFloatTile = Align(sizeof(float) * kTile * kLdF);
  static constexpr size_t kWarpTiles = Align(sizeof(float) * kWarps * 16 * kLdW);
  static constexpr size_t kRows = Align(sizeof(float) * kTile);
};

// Forward: q, k (narrowed), v (tf32), the warps' scores, o (fp32), m, l, alpha per row.
template <typename N, int HS>
struct ForwardSmem : Geometry<N, HS> {
  using G = Geometry<N, HS>;
  static constexpr size_t kQ = 0, kK = kQ + G::kNarrowTile, kV = kK + G::kNarrowTile,
                          kS = kV + G::kFloatTile, kO = kS + G::kWarpTiles, kM = kO + G::kFloatTile,
                          kL = kM + G::kRows, kAlpha = kL + G::kRows, kBytes = kAlpha + G::kRows;
};

// dq: q, dout (narrowed, this block's), k, v (narrowed), k (tf32), the warps' S and dP,
// lse and D per row.
template <typename N, int HS>
struct DqSmem : Geometry<N, HS> {
  using G = Geometry<N, HS>;
  static constexpr size_t kQ = 0, kDout = kQ + G::kNarrowTile, kK = kDout + G::kNarrowTile,
                          kV = kK + G::kNarrowTile, kKf = kV + G::kNarrowTile,
                          kS = kKf + G::kFloatTile, kDp = kS + G::kWarpTiles,
                          kLse = kDp + G::kWarpTiles, kD = kLse + G::kRows, kBytes = kD + G::kRows;
};

// dk, dv: k, v (narrowed, this block's), q, dout (narrowed and tf32), the warps' P^T and
// dP^T, lse and D of the query tile.
template <typename N, int HS>
struct DkvSmem : Geometry<N, HS> {
  using G = Geometry<N, HS>;
  static constexpr size_t kK = 0, kV = kK + G::kNarrowTile, kQ = kV + G::kNarrowTile,
                          kDout = kQ + G::kNarrowTile, kQf = kDout + G::kNarrowTile,
                          kDoutf = kQf + G::kFloatTile, kP = kDoutf + G::kFloatTile,
                          kDp = kP + G::kWarpTiles, kLse = kDp + G::kWarpTiles,
                          kD = kLse + G::kRows, kBytes = kD + G::kRows;
};

// Rows [t0, t0 + kTile) of one head's (T, HS) slice of a row-major source (row stride ld
// elements; src at row 0 of the slice) into shared memory: narrowed into `narrow` (ldm
// kLdN) and/or tf32-rounded into `wide` (ldm kLdF), either may be null. Rows past T are
// zeros. The source is an operand buffer (qkv) or floats (dout) as OperandIn reads them:
// each value as N rounds it (a float one may be a GEMM's unrounded output, which
// Ops::NarrowWritten leaves so on this table), so the tf32 copy holds it exactly too. Float
// sources load as float4: HS and ld are multiples of 4 and src is 16-byte aligned.
template <typename N, int HS>
__device__ void LoadTile(N* narrow, float* wide, OperandIn src, size_t ld, int t0, int T) {
  using G = Geometry<N, HS>;
  constexpr int kVecs = HS / 4;
  for (int e = threadIdx.x; e < kTile * kVecs; e += kThreads) {
    const int r = e / kVecs, c = (e % kVecs) * 4;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (t0 + r < T) {
      const size_t at = static_cast<size_t>(t0 + r) * ld + c;
      if (src.narrow) {
        const N* p = static_cast<const N*>(src.data) + at;
        for (int k = 0; k < 4; ++k) v[k] = ToFloat(p[k]);
      } else {
        const float4 f = *reinterpret_cast<const float4*>(static_cast<const float*>(src.data) + at);
        v[0] = Stored<N>(f.x);
        v[1] = Stored<N>(f.y);
        v[2] = Stored<N>(f.z);
        v[3] = Stored<N>(f.w);
      }
    }
    if (narrow != nullptr) {
      N* d = narrow + r * G::kLdN + c;
      for (int k = 0; k < 4; ++k) d[k] = ToNarrow<N>(v[k]);
    }
    if (wide != nullptr) {
      float* d = wide + r * G::kLdF + c;
      for (int k = 0; k < 4; ++k) d[k] = Tf32(v[k]);
    }
  }
}

// The softmax passes give each row of a warp's 16 x 64 tile two lanes (lane = 2 r + half),
// each reading 32 of its columns. Rows are kLdW floats apart, 4 banks modulo 32, so the
// plain split (columns half * 32 + i at step i) puts both lanes of a row, and rows r and
// r + 8, on one bank: 4-way conflicts on every access. Here the low two bits of the column
// differ between those four lanes instead (half, and r / 8), and every step's 32 reads hit
// 32 banks. Over its 32 steps each lane sees two columns of every group of four.
template <int kLdW>
__device__ __forceinline__ int SoftmaxColumn(int i, int r, int half) {
  static_assert(kLdW % 32 == 4, "the column order assumes rows 4 banks apart");
  return 4 * (i / 2) + (2 * (i % 2) + half + 2 * (r / 8)) % 4;
}

// out (16, 16 * blocks; ldm kLdW) = a (16, HS) b^T for the first `blocks` 16-column blocks,
// b (16 * blocks, HS) row-major: a warp's scores (or dP) against a tile of rows. Narrowed
// operands, fp32 accumulation. Column blocks from `first` on only.
template <typename N, int HS>
__device__ __forceinline__ void RowsTimesTileT(float* out, const N* a, const N* b, int first,
                                               int blocks) {
  using G = Geometry<N, HS>;
  for (int j = first; j < blocks; ++j) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int d = 0; d < HS; d += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, N, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, N, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + d, G::kLdN);
      wmma::load_matrix_sync(fb, b + j * 16 * G::kLdN + d, G::kLdN);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + j * 16, acc, G::kLdW, wmma::mem_row_major);
  }
}

// acc[n] (16, 16 each: 16 x HS) += a (16, 8 * steps; tf32, ldm kLdW) b (8 * steps, HS; tf32,
// ldm kLdF), the k steps from `first` on.
// The fragment loops are unrolled: acc is indexed by compile-time constants only, so it stays
// in registers rather than local memory.
template <int HS, int kLdW, int kLdF>
__device__ __forceinline__ void AccumulateTf32(
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> (&acc)[HS / 16], const float* a,
    const float* b, int first, int steps) {
  for (int kk = first; kk < steps; ++kk) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::load_matrix_sync(fa, a + kk * 8, kLdW);  // already tf32 values
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + kk * 8 * kLdF + n * 16, kLdF);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes a warp's 16 x HS accumulators through its shared tile `stage` (ldm kLdW) to rows
// t0.. of dst (row stride ld elements, dst at row 0 of the head's slice), rows < T only, each
// element stored as N rounds it.
template <typename N, int HS, int kLdW>
__device__ __forceinline__ void StoreRows(
    OperandOut dst, size_t ld, int t0, int T,
    const wmma::fragment<wmma::accumulator, 16, 16, 8, float> (&acc)[HS / 16], float* stage) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) {
    wmma::store_matrix_sync(stage + n * 16, acc[n], kLdW, wmma::mem_row_major);
  }
  __syncwarp();
  for (int e = lane; e < 16 * HS; e += 32) {
    const int r = e / HS, d = e % HS;
    if (t0 + r < T) dst.Put(static_cast<size_t>(t0 + r) * ld + d, stage[r * kLdW + d]);
  }
}

template <typename N, int HS>
__global__ void __launch_bounds__(kThreads, 1)
    FlashForwardKernel(OperandOut out, float* lse, OperandIn qkv, int T, int C, int NH,
                       float scale) {
  using S = ForwardSmem<N, HS>;
  DROVER_DYNAMIC_SHARED(smem);
  N* q = At<N>(smem, S::kQ);
  N* k = At<N>(smem, S::kK);
  float* v = At<float>(smem, S::kV);
  float* o = At<float>(smem, S::kO);
  float* row_m = At<float>(smem, S::kM);
  float* row_l = At<float>(smem, S::kL);
  float* row_alpha = At<float>(smem, S::kAlpha);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s = At<float>(smem, S::kS) + warp * 16 * S::kLdW;
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = qt * kTile;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);

  LoadTile<N, HS>(q, nullptr, base, ld, q0, T);
  for (int e = threadIdx.x; e < kTile * S::kLdF; e += kThreads) o[e] = 0.0f;
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    row_m[r] = -INFINITY;
    row_l[r] = 0.0f;
  }
  // Softmax rows: two lanes per row, 32 columns each (SoftmaxColumn).
  const int r = lane / 2, half = lane % 2;
  const int row = warp * 16 + r;  // in the tile
  const int tq = q0 + row;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous k and v
    LoadTile<N, HS>(k, nullptr, base.At(C), ld, k0, T);
    LoadTile<N, HS>(nullptr, v, base.At(2 * static_cast<size_t>(C)), ld, k0, T);
    __syncthreads();
    const bool diagonal = kt == qt;
    // On the diagonal, key blocks past the warp's own rows are masked whole: skipped.
    const int key_blocks = diagonal ? warp + 1 : kWarps;
    RowsTimesTileT<N, HS>(s, q + warp * 16 * S::kLdN, k, 0, key_blocks);
    __syncwarp();

    // Online softmax of the row: columns c <= limit are keys the row sees.
    const int limit = min(tq, T - 1) - k0;
    float* srow = s + r * S::kLdW;
    float mx = -INFINITY;
    for (int i = 0; i < 32; ++i) {
      const int c = SoftmaxColumn<S::kLdW>(i, r, half);
      if (c <= limit) mx = fmaxf(mx, srow[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)) * scale;
    const float m_old = row_m[row];
    const float m_new = fmaxf(m_old, mx);  // finite: column 0 is seen by every row
    float sum = 0.0f;
    for (int i = 0; i < 32; ++i) {
      const int c = SoftmaxColumn<S::kLdW>(i, r, half);
      const float p = c <= limit ? expf(srow[c] * scale - m_new) : 0.0f;
      srow[c] = Tf32(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    __syncwarp();  // both lanes of the row read m_old before it changes
    if (half == 0) {
      const float alpha = expf(m_old - m_new);  // 0 at the first tile (m_old = -inf)
      row_alpha[row] = alpha;
      row_l[row] = row_l[row] * alpha + sum;
      row_m[row] = m_new;
    }
    __syncwarp();

    // o (the warp's 16 rows) = o alpha + P v.
    float* ow = o + warp * 16 * S::kLdF;
    for (int e = lane; e < 16 * HS; e += 32) {
      ow[(e / HS) * S::kLdF + e % HS] *= row_alpha[warp * 16 + e / HS];
    }
    __syncwarp();
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[HS / 16];
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      wmma::load_matrix_sync(acc[n], ow + n * 16, S::kLdF, wmma::mem_row_major);
    }
    // On the diagonal, P is zero past the warp's rows: 8-key steps up to them.
    AccumulateTf32<HS, S::kLdW, S::kLdF>(acc, s, v, 0, diagonal ? 2 * (warp + 1) : kTile / 8);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      wmma::store_matrix_sync(ow + n * 16, acc[n], S::kLdF, wmma::mem_row_major);
    }
  }
  __syncwarp();
  const float* ow = o + warp * 16 * S::kLdF;
  for (int e = lane; e < 16 * HS; e += 32) {
    const int rr = e / HS, d = e % HS;
    const int t = q0 + warp * 16 + rr;
    if (t < T) {
      const float value = ow[rr * S::kLdF + d] / row_l[warp * 16 + rr];
      const size_t at = (static_cast<size_t>(b) * T + t) * C + h * HS + d;
      out.Put(at, value);
    }
  }
  if (lane < 16 && q0 + warp * 16 + lane < T) {
    const int rr = warp * 16 + lane;
    lse[static_cast<size_t>(blockIdx.y) * T + q0 + rr] = row_m[rr] + logf(row_l[rr]);
  }
}

// P and dS of 16 x 64 tiles, in place, for the two backward kernels: p = exp(s scale - lse),
// ds = p (dp - D) scale, both zero where `visible` says the pair is masked; written as tf32.
// Two lanes per row, 32 columns each (SoftmaxColumn); lse and D are per row (dq) or per
// column (dk, dv).
template <int ld, typename Visible, typename Lse, typename Dot>
__device__ __forceinline__ void SoftmaxGrad(float* s, float* dp, float scale, Visible visible,
                                            Lse lse, Dot dot) {
  const int lane = threadIdx.x % 32;
  const int r = lane / 2, half = lane % 2;
  for (int i = 0; i < 32; ++i) {
    const int c = SoftmaxColumn<ld>(i, r, half);
    float p = 0.0f, ds = 0.0f;
    if (visible(r, c)) {
      p = expf(s[r * ld + c] * scale - lse(r, c));
      ds = p * (dp[r * ld + c] - dot(r, c)) * scale;
    }
    s[r * ld + c] = Tf32(p);
    dp[r * ld + c] = Tf32(ds);
  }
}

// The log-sum-exp and D of query rows [q0, q0 + kTile) of this block's (b, h) into shared
// memory; zeros past T (those rows are masked everywhere).
__device__ void LoadRowStats(float* tile_lse, float* tile_d, const float* lse, const float* D,
                             int q0, int T) {
  const size_t at = static_cast<size_t>(blockIdx.y) * T + q0;
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    tile_lse[r] = q0 + r < T ? lse[at + r] : 0.0f;
    tile_d[r] = q0 + r < T ? D[at + r] : 0.0f;
  }
}

template <typename N, int HS>
__global__ void __launch_bounds__(kThreads, 1)
    FlashDqKernel(OperandOut dqkv, OperandIn dout, const float* lse, const float* D, OperandIn qkv,
                  int T, int C, int NH, float scale) {
  using S = DqSmem<N, HS>;
  DROVER_DYNAMIC_SHARED(smem);
  N* q = At<N>(smem, S::kQ);
  N* dn = At<N>(smem, S::kDout);
  N* k = At<N>(smem, S::kK);
  N* v = At<N>(smem, S::kV);
  float* kf = At<float>(smem, S::kKf);
  float* row_lse = At<float>(smem, S::kLse);
  float* row_d = At<float>(smem, S::kD);
  const int warp = threadIdx.x / 32;
  float* s = At<float>(smem, S::kS) + warp * 16 * S::kLdW;
  float* dp = At<float>(smem, S::kDp) + warp * 16 * S::kLdW;
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = qt * kTile;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);

  LoadTile<N, HS>(q, nullptr, base, ld, q0, T);
  LoadTile<N, HS>(dn, nullptr, dout.At(static_cast<size_t>(b) * T * C + h * HS), C, q0, T);
  LoadRowStats(row_lse, row_d, lse, D, q0, T);
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> dq[HS / 16];
#pragma unroll
  for (auto& f : dq) wmma::fill_fragment(f, 0.0f);
  const int first_row = warp * 16;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    LoadTile<N, HS>(k, kf, base.At(C), ld, k0, T);
    LoadTile<N, HS>(v, nullptr, base.At(2 * static_cast<size_t>(C)), ld, k0, T);
    __syncthreads();
    const bool diagonal = kt == qt;
    const int key_blocks = diagonal ? warp + 1 : kWarps;
    RowsTimesTileT<N, HS>(s, q + first_row * S::kLdN, k, 0, key_blocks);
    RowsTimesTileT<N, HS>(dp, dn + first_row * S::kLdN, v, 0, key_blocks);
    __syncwarp();
    SoftmaxGrad<S::kLdW>(
        s, dp, scale,
        [=](int r, int c) {
          const int t = q0 + first_row + r;
          return k0 + c <= t && t < T;
        },
        [=](int r, int) { return row_lse[first_row + r]; },
        [=](int r, int) { return row_d[first_row + r]; });
    __syncwarp();
    AccumulateTf32<HS, S::kLdW, S::kLdF>(dq, dp, kf, 0, diagonal ? 2 * (warp + 1) : kTile / 8);
  }
  __syncwarp();
  StoreRows<N, HS, S::kLdW>(dqkv.At(static_cast<size_t>(b) * T * ld + h * HS), ld, q0 + first_row,
                            T, dq, s);
}

template <typename N, int HS>
__global__ void __launch_bounds__(kThreads, 1)
    FlashDkvKernel(OperandOut dqkv, OperandIn dout, const float* lse, const float* D, OperandIn qkv,
                   int T, int C, int NH, float scale) {
  using S = DkvSmem<N, HS>;
  DROVER_DYNAMIC_SHARED(smem);
  N* k = At<N>(smem, S::kK);
  N* v = At<N>(smem, S::kV);
  N* q = At<N>(smem, S::kQ);
  N* dn = At<N>(smem, S::kDout);
  float* qf = At<float>(smem, S::kQf);
  float* df = At<float>(smem, S::kDoutf);
  float* col_lse = At<float>(smem, S::kLse);
  float* col_d = At<float>(smem, S::kD);
  const int warp = threadIdx.x / 32;
  float* pt = At<float>(smem, S::kP) + warp * 16 * S::kLdW;
  float* dpt = At<float>(smem, S::kDp) + warp * 16 * S::kLdW;
  const int kt = blockIdx.x;  // the first key tiles have the most queries: first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int k0 = kt * kTile;
  const int tiles = gridDim.x;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  const OperandIn dbase = dout.At(static_cast<size_t>(b) * T * C + h * HS);

  LoadTile<N, HS>(k, nullptr, base.At(C), ld, k0, T);
  LoadTile<N, HS>(v, nullptr, base.At(2 * static_cast<size_t>(C)), ld, k0, T);
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> dk[HS / 16], dv[HS / 16];
#pragma unroll
  for (auto& f : dk) wmma::fill_fragment(f, 0.0f);
#pragma unroll
  for (auto& f : dv) wmma::fill_fragment(f, 0.0f);
  const int first_key = warp * 16;
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();
    LoadTile<N, HS>(q, qf, base, ld, q0, T);
    LoadTile<N, HS>(dn, df, dbase, C, q0, T);
    LoadRowStats(col_lse, col_d, lse, D, q0, T);
    __syncthreads();
    const bool diagonal = qt == kt;
    // On the diagonal, query blocks before the warp's keys see none of them: skipped.
    const int first_block = diagonal ? warp : 0;
    RowsTimesTileT<N, HS>(pt, k + first_key * S::kLdN, q, first_block, kWarps);
    RowsTimesTileT<N, HS>(dpt, v + first_key * S::kLdN, dn, first_block, kWarps);
    __syncwarp();
    SoftmaxGrad<S::kLdW>(
        pt, dpt, scale,
        [=](int r, int c) {
          const int t = q0 + c;
          return t >= k0 + first_key + r && t < T;
        },
        [=](int, int c) { return col_lse[c]; }, [=](int, int c) { return col_d[c]; });
    __syncwarp();
    const int first_step = diagonal ? 2 * warp : 0;
    AccumulateTf32<HS, S::kLdW, S::kLdF>(dv, pt, df, first_step, kTile / 8);
    AccumulateTf32<HS, S::kLdW, S::kLdF>(dk, dpt, qf, first_step, kTile / 8);
  }
  __syncwarp();
  const OperandOut dbase_qkv = dqkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  StoreRows<N, HS, S::kLdW>(dbase_qkv.At(C), ld, k0 + first_key, T, dk, pt);
  __syncwarp();
  StoreRows<N, HS, S::kLdW>(dbase_qkv.At(2 * static_cast<size_t>(C)), ld, k0 + first_key, T, dv,
                            pt);
}

template <typename N, int HS>
void Forward(OperandOut out, float* state, OperandIn qkv, int B, int T, int C, int NH,
             cudaStream_t stream) {
  float* lse = state;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  LaunchWithShared(FlashForwardKernel<N, HS>, Grid(B, T, NH), ForwardSmem<N, HS>::kBytes, stream,
                   out, lse, qkv, T, C, NH, scale);
}

template <typename N, int HS>
void Backward(OperandOut dqkv, float* dot, OperandIn dy, OperandIn out, const float* state,
              OperandIn qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  const float* lse = state;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  if (dy.narrow) {
    fused::SoftmaxDot<N, HS>(dot, static_cast<N*>(nullptr), static_cast<const N*>(dy.data), out, B,
                             T, C, NH, stream);
  } else {
    fused::SoftmaxDot<N, HS>(dot, static_cast<N*>(nullptr), static_cast<const float*>(dy.data), out,
                             B, T, C, NH, stream);
  }
  LaunchWithShared(FlashDqKernel<N, HS>, Grid(B, T, NH), DqSmem<N, HS>::kBytes, stream, dqkv, dy,
                   lse, static_cast<const float*>(dot), qkv, T, C, NH, scale);
  LaunchWithShared(FlashDkvKernel<N, HS>, Grid(B, T, NH), DkvSmem<N, HS>::kBytes, stream, dqkv, dy,
                   lse, static_cast<const float*>(dot), qkv, T, C, NH, scale);
}

// The most dynamic shared memory a kernel of head size HS takes (2-byte N: bf16 and fp16
// alike).
template <int HS>
constexpr size_t SharedBytes() {
  using N = __nv_bfloat16;
  static_assert(sizeof(N) == sizeof(__half));
  return std::max({ForwardSmem<N, HS>::kBytes, DqSmem<N, HS>::kBytes, DkvSmem<N, HS>::kBytes});
}

}  // namespace

bool FlashAttentionApplies(int C, int NH, Precision operands) {
  if (operands == Precision::kFp32 || NH <= 0 || C % NH != 0) return false;
  if (!fused::FusedHeadSize(C / NH)) return false;
  // The most dynamic shared memory one of the head size's kernels takes.
  const size_t bytes =
      fused::ForHeadSize(C / NH, [](auto hs) { return SharedBytes<decltype(hs)::value>(); });
  // sm_90 gives a block 227 KiB, enough for every head size; sm_86/sm_89 give 99 KiB and
  // sm_80 163 KiB, too little for HS = 64 (104.5 KiB) or 128 (200.5 KiB). Those runs keep the
  // GEMMs rather than fail at cudaFuncSetAttribute.
  return bytes <= fused::SharedOptIn();
}

size_t FlashAttentionStateFloats(int B, int T, int C, int NH) {
  (void)C;
  return static_cast<size_t>(B) * NH * T;  // each row's log-sum-exp
}

void FlashAttentionForward(float* out, float* state, const float* qkv, int B, int T, int C, int NH,
                           Precision operands, bool narrow, cudaStream_t stream) {
  const OperandOut o{out, narrow, operands};
  const OperandIn q{qkv, narrow, operands};
  DROVER_CUDA_REQUIRE(FlashAttentionApplies(C, NH, operands));
  RequireShapes(qkv, qkv, B, T, C, NH);
  fused::ForKernel(operands, C / NH, [&](auto n, auto hs) {
    Forward<typename decltype(n)::type, decltype(hs)::value>(o, state, q, B, T, C, NH, stream);
  });
}

void FlashAttentionBackward(float* dqkv, float* dot, const float* dout, bool dout_narrow,
                            const float* out, const float* state, const float* qkv, int B, int T,
                            int C, int NH, Precision operands, bool narrow, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(!dout_narrow || narrow);
  const OperandOut d{dqkv, narrow, operands};
  const OperandIn dy{dout, dout_narrow, operands};
  const OperandIn o{out, narrow, operands};
  const OperandIn q{qkv, narrow, operands};
  DROVER_CUDA_REQUIRE(FlashAttentionApplies(C, NH, operands));
  RequireShapes(qkv, dout, B, T, C, NH);
  fused::ForKernel(operands, C / NH, [&](auto n, auto hs) {
    Backward<typename decltype(n)::type, decltype(hs)::value>(d, dot, dy, o, state, q, B, T, C, NH,
                                                              stream);
  });
}

}  // namespace drover::engine::cuda
