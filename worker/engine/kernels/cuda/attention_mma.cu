// Causal multi-head attention over packed qkv (kernels/cpu/attention.h) for mixed-precision
// runs, in the manner of FlashAttention-2: every product on the tensor cores through
// mma.sync with its operands and accumulators in registers (mma.cuh), the (T, T) scores
// never stored anywhere, the masked half never computed.
//
// What sets it apart from flash_attention.cu (wmma): a wmma accumulator's layout is
// unspecified, so that kernel rescales its running output through shared memory and feeds
// the probabilities to the next product as TF32 from shared memory. Here each lane knows
// which rows and columns it holds: the online softmax, the rescaling and the conversion of
// P to the next product's operand all stay in registers, and shared memory holds only the
// q, k, v (and dout) tiles. As FlashAttention does, P and dS enter their products narrowed
// to the run's 16-bit type (bf16 or fp16), at twice TF32's rate; the softmax, its running
// max and sum, its gradient and every accumulation stay fp32.
//
// Work: 64-row tiles, a block of 4 warps, each warp 16 of the tile's rows.
//   forward: a block per query tile walks the key tiles up to the diagonal; each warp keeps
//            its rows' output (16 x HS), running max and running sum in registers, and
//            writes out = o / l, lse = m + log l and the fp32 copy of out backward reads.
//   D:       fused_attention.cuh: D = rowsum(dout * out) per row.
//   dk, dv:  a block per key tile walks the query tiles from the diagonal on; each warp
//            recomputes its 16 keys' P^T and dS^T from lse and D and accumulates
//            dv = P^T dout and dk = dS^T q in registers.
//   dq:      a block per query tile walks the key tiles up to the diagonal; each warp
//            recomputes P and dS for its 16 rows and accumulates dq = dS k in registers.
// Every element of dqkv is written once, with no atomics: the backward is deterministic, at
// the price of computing S and dP twice (once per backward kernel).
//
// Shared memory holds each tile as 16-bit values, row-major (X[row][channel], rows HS + 8
// apart) where a product reads it as "one row per B column" (k for q k^T, v for dout v^T, q
// for k q^T, dout for v dout^T) and transposed (X[channel][row], rows 72 apart) where it
// reads it as "one row per k step" (v for P v, dout for P^T dout, q for dS^T q, k for dS k).
// Either way a lane's operand register is one 32-bit load, and the 8 pad elements put the
// 8 row groups of a warp's loads 4 banks apart: no bank conflicts.
//
// Only mixed-precision runs with a head size of 16, 32, 64 or 128 come here
// (MmaAttentionApplies). State and dot are those of the wmma kernels (fused_attention.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/fused_attention.cuh"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/mma.cuh"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

using fused::Align;
using fused::At;
using fused::kThreads;
using fused::kTile;

constexpr int kBlocks = kTile / 8;  // 8-column blocks of a 64-wide score tile
constexpr int kSteps = kTile / 16;  // 16-deep k steps through 64 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The strides (in 16-bit elements) and sizes (in bytes) of a head size's shared tiles.
template <int HS>
struct Tiles {
  static constexpr int kLd = HS + 8;      // row-major: X[row][channel]
  static constexpr int kLdT = kTile + 8;  // transposed: X[channel][row]
  static constexpr size_t kRowMajor = Align(2 * static_cast<size_t>(kTile) * kLd);
  static constexpr size_t kTransposed = Align(2 * static_cast<size_t>(HS) * kLdT);
  static constexpr size_t kStats = Align(sizeof(float) * kTile);
  // forward: q, k (row-major), v (transposed)
  static constexpr size_t kForward = 2 * kRowMajor + kTransposed;
  // dk, dv: k, v, q, dout (row-major), q, dout (transposed), lse and D of the query tile
  static constexpr size_t kDkv = 4 * kRowMajor + 2 * kTransposed + 2 * kStats;
  // dq: q, dout, k, v (row-major), k (transposed)
  static constexpr size_t kDq = 4 * kRowMajor + kTransposed;
  static constexpr size_t kMost = kDkv > kDq ? (kDkv > kForward ? kDkv : kForward)
                                             : (kDq > kForward ? kDq : kForward);
};

// Rows [t0, t0 + kTile) of one head's (T, HS) slice of `src` (rows ld elements apart, src at
// row 0 of the slice) into shared memory as N: row-major into `rows` and/or transposed into
// `cols` (either may be null). Rows past T are zeros. The source is an operand buffer (qkv)
// or floats (dout) as OperandIn reads it: each value as N rounds it. Eight elements a load:
// 16 bytes of N, or two float4 (RequireShapes: 16-byte aligned rows).
//
// Which thread takes which eight: along a row first (a warp reads whole rows: coalesced), or,
// where the tile is also stored transposed, down the rows first, so that a warp's 16-bit
// stores into the transposed tile fall on consecutive addresses (two lanes to a word, no
// bank conflict) rather than 8 rows of 72 elements apart, 8 to a bank.
template <typename N, int HS>
__device__ void LoadTile(N* rows, N* cols, OperandIn src, size_t ld, int t0, int T) {
  using L = Tiles<HS>;
  constexpr int kVecs = HS / 8;
  for (int e = threadIdx.x; e < kTile * kVecs; e += kThreads) {
    const int r = cols != nullptr ? e % kTile : e / kVecs;
    const int c = (cols != nullptr ? e / kTile : e % kVecs) * 8;
    // Eight 16-bit values, two to a word, the first in the low half (as Pair reads them).
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (t0 + r < T) {
      const size_t at = static_cast<size_t>(t0 + r) * ld + c;
      if (src.narrow) {
        const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const N*>(src.data) + at);
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
      } else {
        const float* f = static_cast<const float*>(src.data) + at;
        const float4 lo = *reinterpret_cast<const float4*>(f);
        const float4 hi = *reinterpret_cast<const float4*>(f + 4);
        w[0] = PackNarrow<N>(lo.x, lo.y), w[1] = PackNarrow<N>(lo.z, lo.w);
        w[2] = PackNarrow<N>(hi.x, hi.y), w[3] = PackNarrow<N>(hi.z, hi.w);
      }
    }
    if (rows != nullptr) {
      *reinterpret_cast<uint4*>(rows + r * L::kLd + c) = uint4{w[0], w[1], w[2], w[3]};
    }
    if (cols != nullptr) {
      uint16_t* out = reinterpret_cast<uint16_t*>(cols);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        out[(c + i) * L::kLdT + r] = static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2)));
      }
    }
  }
}

// A warp's A fragment of k step kk from 16 rows of a row-major tile (`rows` at its first
// row, stride ld): rows g and g + 8, channels kk * 16 + 2t.. and + 8.
template <typename N>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const N* rows, int ld, int kk) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int c = kk * 16 + 2 * t;
  a[0] = Pair(rows, g * ld + c);
  a[1] = Pair(rows, (g + 8) * ld + c);
  a[2] = Pair(rows, g * ld + c + 8);
  a[3] = Pair(rows, (g + 8) * ld + c + 8);
}

// A B fragment whose column n is row `n0 + n` of a tile (B(k, n) = X[n0 + n][k0 + k]), k
// from k0: X[n0 + g][k0 + 2t..] and X[n0 + g][k0 + 2t + 8..].
template <typename N>
__device__ __forceinline__ void LoadB(uint32_t (&b)[2], const N* x, int ld, int n0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int at = (n0 + g) * ld + k0 + 2 * t;
  b[0] = Pair(x, at);
  b[1] = Pair(x, at + 8);
}

// The A fragment of k step kk made of 8-column accumulator blocks 2kk and 2kk + 1 (mma.cuh):
// a (16 x 64) product's output as the next product's input, narrowed to N.
template <typename N>
__device__ __forceinline__ void AccumulatorsAsA(uint32_t (&a)[4], const float (&x)[kBlocks][4],
                                                int kk) {
  a[0] = PackNarrow<N>(x[2 * kk][0], x[2 * kk][1]);
  a[1] = PackNarrow<N>(x[2 * kk][2], x[2 * kk][3]);
  a[2] = PackNarrow<N>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
  a[3] = PackNarrow<N>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
}

// Two of a warp's 16 x 64 products that share their shape, side by side: x += A1 B1 and
// y += A2 B2, for the 8-column blocks j in [j0, j1) only. A1 and A2 are the warp's 16 rows of
// row-major tiles (a1, a2 at its first row); B1 and B2 take their column n from row n of a
// row-major tile (b1, b2): S = q k^T with dP = dout v^T, or S^T = k q^T with dP^T = v dout^T.
template <typename N, int HS>
__device__ __forceinline__ void TwoProducts(float (&x)[kBlocks][4], float (&y)[kBlocks][4],
                                            const N* a1, const N* a2, const N* b1, const N* b2,
                                            int j0, int j1) {
  using L = Tiles<HS>;
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) {
    uint32_t a1f[4], a2f[4];
    LoadA(a1f, a1, L::kLd, kk);
    LoadA(a2f, a2, L::kLd, kk);
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
      if (j < j0 || j >= j1) continue;
      uint32_t b1f[2], b2f[2];
      LoadB(b1f, b1, L::kLd, j * 8, kk * 16);
      LoadB(b2f, b2, L::kLd, j * 8, kk * 16);
      Mma16816<N>(x[j], a1f, b1f);
      Mma16816<N>(y[j], a2f, b2f);
    }
  }
}

// acc += X B through k steps [kk0, kk1) of the 64-deep product: X a warp's 16 x 64
// accumulators, narrowed to N as the A operand (AccumulatorsAsA); B's column n row n of a
// transposed tile (`cols`): o += P v, dq += dS k, dv += P^T dout, dk += dS^T q.
template <typename N, int HS>
__device__ __forceinline__ void AccumulateProduct(float (&acc)[HS / 8][4],
                                                  const float (&x)[kBlocks][4], const N* cols,
                                                  int kk0, int kk1) {
  using L = Tiles<HS>;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    if (kk < kk0 || kk >= kk1) continue;
    uint32_t a[4];
    AccumulatorsAsA<N>(a, x, kk);
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
      uint32_t b[2];
      LoadB(b, cols, L::kLdT, n * 8, kk * 16);
      Mma16816<N>(acc[n], a, b);
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

template <typename N, int HS>
__global__ void __launch_bounds__(kThreads)
    MmaForwardKernel(OperandOut out, float* lse, float* out_copy, OperandIn qkv, int T, int C,
                     int NH, float scale) {
  using L = Tiles<HS>;
  DROVER_DYNAMIC_SHARED(smem);
  N* q = At<N>(smem, 0);
  N* k = At<N>(smem, L::kRowMajor);
  N* v_cols = At<N>(smem, 2 * L::kRowMajor);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = qt * kTile;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);

  LoadTile<N, HS>(q, nullptr, base, ld, q0, T);
  __syncthreads();
  uint32_t qa[HS / 16][4];  // the warp's 16 rows of q, every k step
#pragma unroll
  for (int kk = 0; kk < HS / 16; ++kk) LoadA(qa[kk], q + warp * 16 * L::kLd, L::kLd, kk);

  // Rows row0 (accumulator elements 0, 1) and row0 + 8 (2, 3); the last key each sees.
  const int row0 = q0 + warp * 16 + g;
  const int last[2] = {min(row0, T - 1), min(row0 + 8, T - 1)};
  // m: the running max of scores in log2 units (scale * log2 e folded in, for exp2); l: this
  // lane's part of the running sum, completed over the row's 4 lanes at the end.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[HS / 8][4] = {};
  const float scale2 = scale * kLog2e;
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous k and v
    LoadTile<N, HS>(k, nullptr, base.At(C), ld, k0, T);
    LoadTile<N, HS>(nullptr, v_cols, base.At(2 * static_cast<size_t>(C)), ld, k0, T);
    __syncthreads();
    // On the diagonal, key blocks past the warp's last row are masked whole: skipped.
    const bool diagonal = kt == qt;
    const int blocks = diagonal ? 2 * (warp + 1) : kBlocks;

    float s[kBlocks][4] = {};  // the warp's 16 x 64 scores
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
        if (j >= blocks) continue;
        uint32_t kb[2];
        LoadB(kb, k, L::kLd, j * 8, kk * 16);
        Mma16816<N>(s[j], qa[kk], kb);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + j * 8 + 2 * t + e % 2;
        const float x = j < blocks && key <= last[e / 2] ? s[j][e] * scale2 : -INFINITY;
        s[j][e] = x;
        mx[e / 2] = fmaxf(mx[e / 2], x);
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // Finite: key 0 is in the first tile and every row sees it.
      const float m_new = fmaxf(m[i], RowMax(mx[i]));
      alpha[i] = exp2f(m[i] - m_new);  // 0 at the first tile (m = -inf)
      m[i] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[j][e] - m[e / 2]);  // 0 where masked (-inf)
        s[j][e] = p;
        sum[e / 2] += p;
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + sum[i];
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e / 2];
    }
    // o += P v; on the diagonal P is zero past the warp's rows.
    AccumulateProduct<N, HS>(o, s, v_cols, 0, diagonal ? warp + 1 : kSteps);
  }
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = RowSum(l[i]);
    inv[i] = 1.0f / l[i];
  }
#pragma unroll
  for (int n = 0; n < HS / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] *= inv[e / 2];
  }
  const size_t head = static_cast<size_t>(b) * T * C + h * HS;
  StoreRows<HS>(out.At(head), C, row0 - g, T, o);
  // The unrounded copy backward's row sums read.
  StoreRows<HS>(OperandOut{out_copy + head, false, Precision::kFp32}, C, row0 - g, T, o);
  if (t == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = row0 + 8 * i;
      if (r < T) lse[static_cast<size_t>(blockIdx.y) * T + r] = (m[i] + log2f(l[i])) * kLn2;
    }
  }
}

template <typename N, int HS>
__global__ void __launch_bounds__(kThreads)
    MmaDkvKernel(OperandOut dqkv, OperandIn dout, const float* lse, const float* D, OperandIn qkv,
                 int T, int C, int NH, float scale) {
  using L = Tiles<HS>;
  DROVER_DYNAMIC_SHARED(smem);
  N* k = At<N>(smem, 0);
  N* v = At<N>(smem, L::kRowMajor);
  N* q = At<N>(smem, 2 * L::kRowMajor);
  N* dout_rows = At<N>(smem, 3 * L::kRowMajor);
  N* q_cols = At<N>(smem, 4 * L::kRowMajor);
  N* dout_cols = At<N>(smem, 4 * L::kRowMajor + L::kTransposed);
  float* col_lse = At<float>(smem, 4 * L::kRowMajor + 2 * L::kTransposed);
  float* col_d = At<float>(smem, 4 * L::kRowMajor + 2 * L::kTransposed + L::kStats);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kt = blockIdx.x;  // the first key tiles have the most queries: first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int k0 = kt * kTile;
  const int tiles = gridDim.x;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  const OperandIn dbase = dout.At(static_cast<size_t>(b) * T * C + h * HS);

  LoadTile<N, HS>(k, nullptr, base.At(C), ld, k0, T);
  LoadTile<N, HS>(v, nullptr, base.At(2 * static_cast<size_t>(C)), ld, k0, T);
  // Keys key0 (accumulator elements 0, 1) and key0 + 8 (2, 3) of the transposed scores.
  const int key0 = k0 + warp * 16 + g;
  const float scale2 = scale * kLog2e;
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
  for (int qt = kt; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();  // every warp is done with the previous query tile
    LoadTile<N, HS>(q, q_cols, base, ld, q0, T);
    LoadTile<N, HS>(dout_rows, dout_cols, dbase, C, q0, T);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      const bool in = q0 + r < T;
      const size_t at = static_cast<size_t>(blockIdx.y) * T + q0 + r;
      col_lse[r] = in ? lse[at] * kLog2e : 0.0f;
      col_d[r] = in ? D[at] : 0.0f;
    }
    __syncthreads();
    // On the diagonal, query blocks before the warp's first key see none of its keys.
    const bool diagonal = qt == kt;
    const int first = diagonal ? 2 * warp : 0;

    // S^T = k q^T and dP^T = v dout^T, the warp's 16 keys by the tile's 64 queries.
    float st[kBlocks][4] = {}, dpt[kBlocks][4] = {};
    const int rows = warp * 16 * L::kLd;
    TwoProducts<N, HS>(st, dpt, k + rows, v + rows, q, dout_rows, first, kBlocks);
    // P^T = exp(S^T scale - lse) and dS^T = P^T (dP^T - D) scale, zero where masked.
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = j * 8 + 2 * t + e % 2;  // the query, in the tile
        const int key = key0 + (e / 2) * 8;
        const bool visible = j >= first && q0 + c >= key && q0 + c < T && key < T;
        const float p = visible ? exp2f(st[j][e] * scale2 - col_lse[c]) : 0.0f;
        st[j][e] = p;
        dpt[j][e] = p * (dpt[j][e] - col_d[c]) * scale;
      }
    }
    // dv += P^T dout and dk += dS^T q, k stepping through the queries.
    AccumulateProduct<N, HS>(dv, st, dout_cols, first / 2, kSteps);
    AccumulateProduct<N, HS>(dk, dpt, q_cols, first / 2, kSteps);
  }
  const OperandOut head = dqkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  StoreRows<HS>(head.At(C), ld, key0 - g, T, dk);
  StoreRows<HS>(head.At(2 * static_cast<size_t>(C)), ld, key0 - g, T, dv);
}

template <typename N, int HS>
__global__ void __launch_bounds__(kThreads)
    MmaDqKernel(OperandOut dqkv, OperandIn dout, const float* lse, const float* D, OperandIn qkv,
                int T, int C, int NH, float scale) {
  using L = Tiles<HS>;
  DROVER_DYNAMIC_SHARED(smem);
  N* q = At<N>(smem, 0);
  N* dout_rows = At<N>(smem, L::kRowMajor);
  N* k = At<N>(smem, 2 * L::kRowMajor);
  N* v = At<N>(smem, 3 * L::kRowMajor);
  N* k_cols = At<N>(smem, 4 * L::kRowMajor);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = qt * kTile;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);

  LoadTile<N, HS>(q, nullptr, base, ld, q0, T);
  LoadTile<N, HS>(dout_rows, nullptr, dout.At(static_cast<size_t>(b) * T * C + h * HS), C, q0, T);
  const int row0 = q0 + warp * 16 + g;
  float row_lse[2], row_d[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + 8 * i;
    const size_t at = static_cast<size_t>(blockIdx.y) * T + r;
    row_lse[i] = r < T ? lse[at] * kLog2e : 0.0f;
    row_d[i] = r < T ? D[at] : 0.0f;
  }
  const float scale2 = scale * kLog2e;
  float dq[HS / 8][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous k and v
    LoadTile<N, HS>(k, k_cols, base.At(C), ld, k0, T);
    LoadTile<N, HS>(v, nullptr, base.At(2 * static_cast<size_t>(C)), ld, k0, T);
    __syncthreads();
    const bool diagonal = kt == qt;
    const int blocks = diagonal ? 2 * (warp + 1) : kBlocks;

    // S = q k^T and dP = dout v^T, the warp's 16 rows by the tile's 64 keys.
    float s[kBlocks][4] = {}, dp[kBlocks][4] = {};
    const int rows = warp * 16 * L::kLd;
    TwoProducts<N, HS>(s, dp, q + rows, dout_rows + rows, k, v, 0, blocks);
    // dS = P (dP - D) scale with P = exp(S scale - lse), into s; zero where masked.
#pragma unroll
    for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + j * 8 + 2 * t + e % 2;
        const int r = row0 + (e / 2) * 8;
        const bool visible = j < blocks && key <= r && key < T && r < T;
        const float p = visible ? exp2f(s[j][e] * scale2 - row_lse[e / 2]) : 0.0f;
        s[j][e] = p * (dp[j][e] - row_d[e / 2]) * scale;
      }
    }
    // dq += dS k, k stepping through the keys; on the diagonal dS is zero past the rows.
    AccumulateProduct<N, HS>(dq, s, k_cols, 0, diagonal ? warp + 1 : kSteps);
  }
  StoreRows<HS>(dqkv.At(static_cast<size_t>(b) * T * ld + h * HS), ld, row0 - g, T, dq);
}

template <typename N, int HS>
void Forward(OperandOut out, float* state, OperandIn qkv, int B, int T, int C, int NH,
             cudaStream_t stream) {
  float* lse = state;
  float* out_copy = state + static_cast<size_t>(B) * NH * T;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  fused::LaunchWithShared(MmaForwardKernel<N, HS>, fused::Grid(B, T, NH), Tiles<HS>::kForward,
                          stream, out, lse, out_copy, qkv, T, C, NH, scale);
}

template <typename N, int HS>
void Backward(OperandOut dqkv, float* dot, const float* dout, const float* state, OperandIn qkv,
              int B, int T, int C, int NH, cudaStream_t stream) {
  const OperandIn dy{dout, false, qkv.precision};  // floats (attention's input gradient)
  const float* lse = state;
  const float* out_copy = state + static_cast<size_t>(B) * NH * T;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  fused::SoftmaxDot<N, HS>(dot, dout, out_copy, B, T, C, NH, stream);
  fused::LaunchWithShared(MmaDqKernel<N, HS>, fused::Grid(B, T, NH), Tiles<HS>::kDq, stream, dqkv,
                          dy, lse, static_cast<const float*>(dot), qkv, T, C, NH, scale);
  fused::LaunchWithShared(MmaDkvKernel<N, HS>, fused::Grid(B, T, NH), Tiles<HS>::kDkv, stream, dqkv,
                          dy, lse, static_cast<const float*>(dot), qkv, T, C, NH, scale);
}

}  // namespace

bool MmaAttentionApplies(int C, int NH, Precision operands) {
  if (operands == Precision::kFp32 || NH <= 0 || C % NH != 0) return false;
  if (!fused::FusedHeadSize(C / NH)) return false;
  // The most dynamic shared memory one of the head size's kernels takes: HS = 64 takes
  // 55 KiB, which every GPU with mma.sync for bf16 (sm_80 on) gives a block; HS = 128 takes
  // 105 KiB, past sm_86/sm_89's 99 KiB.
  const size_t bytes =
      fused::ForHeadSize(C / NH, [](auto hs) { return Tiles<decltype(hs)::value>::kMost; });
  return bytes <= fused::SharedOptIn();
}

void MmaAttentionForward(float* out, float* state, const float* qkv, int B, int T, int C, int NH,
                         Precision operands, bool narrow, cudaStream_t stream) {
  const OperandOut o{out, narrow, operands};
  const OperandIn q{qkv, narrow, operands};
  DROVER_CUDA_REQUIRE(MmaAttentionApplies(C, NH, operands));
  fused::RequireShapes(qkv, qkv, B, T, C, NH);
  fused::ForKernel(operands, C / NH, [&](auto n, auto hs) {
    Forward<typename decltype(n)::type, decltype(hs)::value>(o, state, q, B, T, C, NH, stream);
  });
}

void MmaAttentionBackward(float* dqkv, float* dot, const float* dout, const float* state,
                          const float* qkv, int B, int T, int C, int NH, Precision operands,
                          bool narrow, cudaStream_t stream) {
  const OperandOut d{dqkv, narrow, operands};
  const OperandIn q{qkv, narrow, operands};
  DROVER_CUDA_REQUIRE(MmaAttentionApplies(C, NH, operands));
  fused::RequireShapes(qkv, dout, B, T, C, NH);
  fused::ForKernel(operands, C / NH, [&](auto n, auto hs) {
    Backward<typename decltype(n)::type, decltype(hs)::value>(d, dot, dout, state, q, B, T, C, NH,
                                                              stream);
  });
}

}  // namespace drover::engine::cuda
