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
// Work: blocks of 4 warps; key tiles of 64 rows.
//   forward: a block per query tile walks the key tiles up to the diagonal; each warp keeps
//            its rows' output (rows x HS), running max and running sum in registers, and
//            writes out = o / l and lse = m + log2 l, the row's log-sum-exp in log2 units
//            (ln's times log2 e: what the backward's exp2 takes as it is).
//            16 rows a warp, 64-row query tiles by default (MmaAttentionTiles: others).
//   D:       one pass over dout and out: D = rowsum(dout * out) per row, and dout narrowed to N
//            (its tiles then load as 16-bit copies, asynchronously, as q, k and v do).
//   dk, dv:  a block per key tile walks the query tiles from the diagonal on; each warp
//            recomputes its 16 keys' P^T and dS^T from lse and D and accumulates
//            dv = P^T dout and dk = dS^T q in registers.
//   dq:      a block per 64-row query tile walks the key tiles up to the diagonal; each warp
//            recomputes P and dS for its 16 rows and accumulates dq = dS k in registers.
// Every element of dqkv is written once, with no atomics: the backward is deterministic, at
// the price of computing S and dP twice (once per backward kernel).
//
// Diagonal and inner tiles: each kernel's tile step is compiled twice. Off the diagonal (and,
// in dk dv, inside the sequence) every product is whole and unmasked, so its bounds are
// constants: the compiler issues the products' ldmatrix loads ahead of their mma
// instructions and interleaves the softmax with them. On the diagonal the products stop at
// the pairs the warp's rows see and the scores are masked, at run time. With one path for
// both, every 16-column pair of a product sat behind its own branch, so each mma waited out
// the ldmatrix just before it (sm_90 SASS, cuobjdump: 16 branches a scores product).
//
// Memory (attention_tiles.cuh): each tile sits in shared memory once, row-major, and
// ldmatrix reads it in either orientation. The tiles a block walks are double-buffered and
// copied with cp.async (async_copy.cuh): the next tile's loads are in flight while the tensor
// cores work on this one. Each kernel passes one barrier a tile (the next tile's copies go
// out after it, into the stage every warp has left), but dk dv at HS = 128 two. Launch bounds hold
// the registers to what 3 or 4 blocks an SM allow: the kernels are latency-bound (Nsight Compute:
// most stalls wait on a fixed-latency dependency, no pipe above a quarter busy), and more warps
// hide more of it than more registers buy. The forward takes 4 (128 registers); dk dv and dq take
// 3: dq's inner path, its loads issued early, spills at 4's 128 registers (ptxas -v) and takes 160
// at 3.
//
// Measured on an H200 at GPT-2 124M, B = 32, T = 1024, bf16, kernel time a training step
// (tests/device/kernels.sh), before the split into diagonal and inner paths (not yet timed
// since): forward 5.4 ms, D 0.9, dq 5.4, dk dv 7.8, 19.5 ms in all. The
// kernels this replaced (32-bit fragment loads, a transposed second copy of four tiles stored
// element by element, synchronous loads, dout read as fp32, register-bound occupancy) took
// 32.2 ms. PyTorch's scaled_dot_product_attention on the same shape, same GPU
// (tests/device/attention_profile.sh): its flash kernels 14.4 ms, its cuDNN ones 9.7 ms.
//
// Only mixed-precision runs with a head size of 16, 32, 64 or 128 come here
// (MmaAttentionApplies).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "worker/engine/kernels/cuda/async_copy.cuh"
#include "worker/engine/kernels/cuda/attention_tiles.cuh"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/fused_attention.cuh"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/mma.cuh"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

using namespace attention_tiles;  // NOLINT: the kernels are written in its terms

constexpr float kLog2e = 1.4426950408889634f;

// The forward's shape: 16-row mma tiles a warp (kM) and 8-column blocks a key tile (kNB),
// chosen at run time from MmaAttentionTiles (ops_cuda.h) at head size 64, 16 rows by 64 keys
// at any other. Measured on an H200 at GPT-2 124M, B = 32, T = 1024, the forward's kernel
// time a step: 16 rows a warp and 64 keys a tile 5.4 ms (4 blocks an SM at 128 registers);
// 32 rows, 64 keys 5.8 ms (2 blocks: each k and v fragment feeds two products, but too few
// warps hide the latencies); 16 x 128 9.1 ms and 32 x 128 8.6 ms (more of each diagonal tile
// masked, fewer blocks). Those times are from before the split into diagonal and inner
// paths; tests/bench/attention_tiles_bench.cu (speed.sh runs it) times the shapes again, and
// DROVER_CUDA_ATTENTION_TILES picks one for a run without a rebuild.

// The forward's shared tiles with kM 16-row mma tiles a warp and key tiles of kNB 8-column
// blocks: q (kQueryRows), then k and v (kKeyRows) in each of two stages.
template <int HS, int kM, int kNB>
struct ForwardTiles {
  static constexpr int kQueryRows = 16 * kWarps * kM;
  static constexpr int kKeyRows = 8 * kNB;
  static constexpr size_t kQuery = Tiles<HS>::Bytes(kQueryRows);
  static constexpr size_t kKeyTile = Tiles<HS>::Bytes(kKeyRows);
  static constexpr size_t kBytes = kQuery + 4 * kKeyTile;
};

// Calls f(kM, kNB, kQFromShared), each a std::integral_constant, with the forward shape
// `tiles` names at head size HS: its choice at 64, 16 rows by 64 keys at any other.
template <int HS, typename F>
decltype(auto) WithForwardShape(const MmaAttentionTiles& tiles, F&& f) {
  using Shape = MmaAttentionTiles::Forward;
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  using Keys64 = std::integral_constant<int, 8>;
  if constexpr (HS == 64) {
    switch (tiles.forward) {
      case Shape::k32x64:
        return f(Two{}, Keys64{}, std::false_type{});
      case Shape::k32x64QShared:
        return f(Two{}, Keys64{}, std::true_type{});
      case Shape::k16x64:
        break;
    }
  }
  return f(One{}, Keys64{}, std::false_type{});
}

// The most dynamic shared memory a kernel of the head size takes with `tiles`.
template <int HS>
size_t MostShared(const MmaAttentionTiles& tiles) {
  const size_t forward = WithForwardShape<HS>(tiles, [](auto m, auto nb, auto) {
    return ForwardTiles<HS, decltype(m)::value, decltype(nb)::value>::kBytes;
  });
  return std::max({forward, Tiles<HS>::kDkv, Tiles<HS>::kDq});
}

// The forward's blocks an SM, which its launch bounds hold the registers to: 4 (128
// registers) at the shape kept, fewer where the scores or rows a warp need more registers
// than that without spilling (measured with -Xptxas -v: 16 rows x 128 keys spills at 3's
// 168 registers, 32 x 128 even at 255); HS = 128 takes what it needs.
template <int HS, int kM, int kNB>
constexpr int ForwardBlocksPerSm() {
  if (HS > 64) return 1;
  return kM == 1 && kNB == 8 ? 4 : 2;
}

// kQFromShared: the scores product reads the warp's rows of q from the shared tile a k step
// at a time (ScoresProductFromShared) rather than holding them in registers from the start.
template <typename N, int HS, int kM, int kNB, bool kQFromShared = false>
__global__ void __launch_bounds__(kThreads, ForwardBlocksPerSm<HS, kM, kNB>())
    MmaForwardKernel(OperandOut out, float* lse, OperandIn qkv, int T, int C, int NH, float scale) {
  using F = ForwardTiles<HS, kM, kNB>;
  constexpr int kQueryRows = F::kQueryRows, kKeyRows = F::kKeyRows;
  DROVER_DYNAMIC_SHARED(smem);
  N* q = At<N>(smem, 0);
  auto k_tile = [&](int stage) { return At<N>(smem, F::kQuery + 2 * stage * F::kKeyTile); };
  auto v_tile = [&](int stage) { return At<N>(smem, F::kQuery + (2 * stage + 1) * F::kKeyTile); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = qt * kQueryRows;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  const OperandIn keys = base.At(C), values = base.At(2 * static_cast<size_t>(C));
  // Key tiles [0, tiles) hold every key a row of the tile sees.
  const int tiles = (min(T, q0 + kQueryRows) + kKeyRows - 1) / kKeyRows;

  LoadTile<N, HS, kQueryRows>(q, base, ld, q0, T);
  LoadTile<N, HS, kKeyRows>(k_tile(0), keys, ld, 0, T);
  LoadTile<N, HS, kKeyRows>(v_tile(0), values, ld, 0, T);
  CommitCopies();

  // The warp's rows: [first, first + 16 kM); tile i's lane holds rows first + 16i + g and +8
  // (accumulator elements 0, 1 and 2, 3).
  const int first = q0 + warp * 16 * kM, last = first + 16 * kM - 1;
  uint32_t qa[kM][HS / 16][4];  // the warp's rows of q, every k step (unless kQFromShared)
  // m: the running max of scores in log2 units (scale * log2 e folded in, for exp2); l: this
  // lane's part of the running sum, completed over the row's 4 lanes at the end.
  float m[kM][2], l[kM][2];
  float o[kM][HS / 8][4] = {};
#pragma unroll
  for (int i = 0; i < kM; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.0f;
  const float scale2 = scale * kLog2e;
  for (int kt = 0; kt < tiles; ++kt) {
    const int stage = kt % 2;
    // One barrier a tile: past it, every thread's copies of this tile (and at first, of q)
    // have landed, and every warp is done with the other stage, which the next tile's copies
    // then fill while the tensor cores work on this one.
    WaitCopies<0>();
    __syncthreads();
    if (kt + 1 < tiles) {
      LoadTile<N, HS, kKeyRows>(k_tile(1 - stage), keys, ld, (kt + 1) * kKeyRows, T);
      LoadTile<N, HS, kKeyRows>(v_tile(1 - stage), values, ld, (kt + 1) * kKeyRows, T);
    }
    CommitCopies();
    if constexpr (!kQFromShared) {
      if (kt == 0) {
#pragma unroll
        for (int i = 0; i < kM; ++i) {
#pragma unroll
          for (int kk = 0; kk < HS / 16; ++kk) {
            LoadA<N, HS>(qa[i][kk], q + (warp * kM + i) * 16 * Tiles<HS>::kLd, kk);
          }
        }
      }
    }
    const int k0 = kt * kKeyRows;
    // One key tile's scores, softmax update and o += P v, compiled twice: off the diagonal
    // every product is whole and unmasked, so its bounds are constants and the compiler
    // issues a product's ldmatrix loads ahead of its mma instructions; only tiles on the
    // warp's diagonal (the last one, at the shape kept) bound their products and mask their
    // scores, at run time.
    auto tile = [&](auto on_diagonal) {
      constexpr bool kDiagonal = decltype(on_diagonal)::value;
      const int pairs = kDiagonal ? PairsSeen(k0, last, kNB / 2) : kNB / 2;
      float s[kM][kNB][4] = {};  // the warp's rows x the tile's keys: scores
      if constexpr (kQFromShared) {
        ScoresProductFromShared<N, HS, kM, kNB>(s, q + warp * kM * 16 * Tiles<HS>::kLd,
                                                k_tile(stage), 0, pairs);
      } else {
        ScoresProduct<N, HS, kM, kNB>(s, qa, k_tile(stage), 0, pairs);
      }
#pragma unroll
      for (int i = 0; i < kM; ++i) {
        if constexpr (kDiagonal) {
#pragma unroll
          for (int j = 0; j < kNB; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = k0 + j * 8 + 2 * t + e % 2;
              const int row = first + 16 * i + g + (e / 2) * 8;
              if (key > row) s[i][j][e] = -INFINITY;
            }
          }
        }
        float alpha[2], shift[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // Finite: key 0 is in the first tile and every row sees it.
          const float m_new = fmaxf(m[i][r], RowMax(RowReduce(s[i], r, MaxOf{})) * scale2);
          alpha[r] = FastExp2(m[i][r] - m_new);  // 0 at the first tile (m = -inf)
          m[i][r] = m_new;
          shift[r] = -m_new;
        }
#pragma unroll
        for (int j = 0; j < kNB; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[i][j][e] = FastExp2(fmaf(s[i][j][e], scale2, shift[e / 2]));  // 0 if masked
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          l[i][r] = l[i][r] * alpha[r] + RowReduce(s[i], r, SumOf{});
        }
#pragma unroll
        for (int n = 0; n < HS / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][n][e] *= alpha[e / 2];
        }
      }
      // o += P v; P is zero past the pairs the rows see.
      AccumulateProduct<N, HS, kM, kNB>(o, s, v_tile(stage), 0, pairs);
    };
    // Keys past the warp's last row: none of the tile's keys are seen.
    if (k0 + kKeyRows - 1 > first) {
      if (k0 <= last) tile(std::true_type{});
    } else {
      tile(std::false_type{});
    }
  }
  const size_t head = static_cast<size_t>(b) * T * C + h * HS;
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[i][r] = RowSum(l[i][r]);
      inv[r] = 1.0f / l[i][r];
    }
#pragma unroll
    for (int n = 0; n < HS / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][n][e] *= inv[e / 2];
    }
    const int row0 = first + 16 * i;
    StoreRows<HS>(out.At(head), C, row0, T, o[i]);
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + g + 8 * r;
        if (row < T) {
          lse[static_cast<size_t>(blockIdx.y) * T + row] = m[i][r] + log2f(l[i][r]);
        }
      }
    }
  }
}

// The backward kernels' blocks an SM, which their launch bounds hold the registers to, where
// MmaAttentionTiles does not choose (head sizes but 64); 4 spills at HS = 64 (dq 24 bytes,
// dk dv 1 KB), which the build refuses.
template <int HS>
constexpr int BackwardBlocksPerSm() {
  return HS <= 64 ? 3 : 1;
}

// Calls f(blocks), a std::integral_constant, with `blocks` (2 or 3) at head size 64 and
// BackwardBlocksPerSm at any other.
template <int HS, typename F>
void WithBackwardBlocks(int blocks, F&& f) {
  if constexpr (HS == 64) {
    if (blocks == 2) return f(std::integral_constant<int, 2>{});
    DROVER_CUDA_REQUIRE(blocks == 3);
    return f(std::integral_constant<int, 3>{});
  }
  f(std::integral_constant<int, BackwardBlocksPerSm<HS>()>{});
}

template <typename N, int HS, int kBlocksPerSm = BackwardBlocksPerSm<HS>()>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    MmaDkvKernel(OperandOut dqkv, const N* dout, const float* lse, const float* D, OperandIn qkv,
                 int T, int C, int NH, float scale) {
  using L = Tiles<HS>;
  constexpr bool kOneBarrier = HS <= 64;
  DROVER_DYNAMIC_SHARED(smem);
  N* k = At<N>(smem, 0);
  N* v = At<N>(smem, L::kTile);
  auto q_tile = [&](int stage) { return At<N>(smem, (2 + 2 * stage) * L::kTile); };
  auto dout_tile = [&](int stage) { return At<N>(smem, (3 + 2 * stage) * L::kTile); };
  auto lse_tile = [&](int stage) { return At<float>(smem, 6 * L::kTile + 2 * stage * L::kStats); };
  auto d_tile = [&](int stage) {
    return At<float>(smem, 6 * L::kTile + (2 * stage + 1) * L::kStats);
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kt = blockIdx.x;  // the first key tiles have the most queries: first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int k0 = kt * kKeys;
  const int tiles = gridDim.x;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  const OperandIn dbase{dout + static_cast<size_t>(b) * T * C + h * HS, true, qkv.precision};
  const float* head_lse = lse + static_cast<size_t>(blockIdx.y) * T;
  const float* head_d = D + static_cast<size_t>(blockIdx.y) * T;
  auto load_queries = [&](int stage, int q0) {
    LoadTile<N, HS, kKeys>(q_tile(stage), base, ld, q0, T);
    LoadTile<N, HS, kKeys>(dout_tile(stage), dbase, C, q0, T);
    LoadStats(lse_tile(stage), head_lse, q0, T);
    LoadStats(d_tile(stage), head_d, q0, T);
  };

  LoadTile<N, HS, kKeys>(k, base.At(C), ld, k0, T);
  LoadTile<N, HS, kKeys>(v, base.At(2 * static_cast<size_t>(C)), ld, k0, T);
  load_queries(0, k0);
  CommitCopies();
  // Keys key0 (accumulator elements 0, 1) and key0 + 8 (2, 3) of the transposed scores.
  const int key0 = k0 + warp * 16 + g;
  const float scale2 = scale * kLog2e;
  float dk[1][HS / 8][4] = {}, dv[1][HS / 8][4] = {};
  for (int qt = kt; qt < tiles; ++qt) {
    const int stage = (qt - kt) % 2;
    const int q0 = qt * kKeys;
    // One barrier a tile as the forward's, up to HS = 64; at HS = 128 two (the next tile's
    // copies issued before this one's wait, the second barrier at the tile's end), as one
    // spills there (16 bytes).
    if constexpr (kOneBarrier) {
      WaitCopies<0>();
      __syncthreads();
      if (qt + 1 < tiles) load_queries(1 - stage, q0 + kKeys);
      CommitCopies();
    } else {
      if (qt + 1 < tiles) load_queries(1 - stage, q0 + kKeys);
      CommitCopies();  // possibly empty: the wait below then always leaves one group
      WaitCopies<1>();
      __syncthreads();
    }
    const N* qs = q_tile(stage);
    const N* douts = dout_tile(stage);
    const float* col_lse = lse_tile(stage);
    const float* col_d = d_tile(stage);
    // One query tile, compiled twice as the forward's key tiles are: whole and unmasked
    // inside the sequence; masked at run time on the diagonal and on the last tile past T,
    // and bounded on the diagonal, where query pairs before the warp's first key see none of
    // its keys.
    auto tile = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      const int p0 = kMasked && qt == kt ? warp : 0;
      // S^T = k q^T and dP^T = v dout^T, the warp's 16 keys by the tile's 64 queries.
      float st[1][kBlocks][4] = {}, dpt[1][kBlocks][4] = {};
      const int rows = warp * 16 * L::kLd;
      TwoScoresProducts<N, HS>(st, dpt, k + rows, v + rows, qs, douts, p0, kBlocks / 2);
      // P^T = exp(S^T scale - lse) and dS^T / scale = P^T (dP^T - D), zero where masked: the
      // scale multiplies dk once at the end, as FlashAttention does, not every dS.
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = j * 8 + 2 * t + e % 2;  // the query, in the tile
          const int key = key0 + (e / 2) * 8;
          const bool visible = !kMasked || (q0 + c >= key && q0 + c < T);
          const float p = visible ? FastExp2(fmaf(st[0][j][e], scale2, -col_lse[c])) : 0.0f;
          st[0][j][e] = p;
          dpt[0][j][e] = p * (dpt[0][j][e] - col_d[c]);  // dS^T / scale
        }
      }
      // dv += P^T dout and dk += dS^T q, k stepping through the queries.
      AccumulateProduct<N, HS, 1>(dv, st, douts, p0, kSteps);
      AccumulateProduct<N, HS, 1>(dk, dpt, qs, p0, kSteps);
    };
    if (qt == kt || q0 + kKeys > T) {
      tile(std::true_type{});
    } else {
      tile(std::false_type{});
    }
    if constexpr (!kOneBarrier) __syncthreads();  // every warp is done with this stage
  }
  ScaleAccumulators<HS>(dk[0], scale);  // dS^T entered its product unscaled
  const OperandOut head = dqkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  StoreRows<HS>(head.At(C), ld, key0 - g, T, dk[0]);
  StoreRows<HS>(head.At(2 * static_cast<size_t>(C)), ld, key0 - g, T, dv[0]);
}

template <typename N, int HS, int kBlocksPerSm = BackwardBlocksPerSm<HS>()>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    MmaDqKernel(OperandOut dqkv, const N* dout, const float* lse, const float* D, OperandIn qkv,
                int T, int C, int NH, float scale) {
  using L = Tiles<HS>;
  DROVER_DYNAMIC_SHARED(smem);
  N* q = At<N>(smem, 0);
  N* dout_rows = At<N>(smem, L::kTile);
  auto k_tile = [&](int stage) { return At<N>(smem, (2 + 2 * stage) * L::kTile); };
  auto v_tile = [&](int stage) { return At<N>(smem, (3 + 2 * stage) * L::kTile); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int b = blockIdx.y / NH, h = blockIdx.y % NH;
  const int q0 = qt * kKeys;
  const size_t ld = 3 * static_cast<size_t>(C);
  const OperandIn base = qkv.At(static_cast<size_t>(b) * T * ld + h * HS);
  const OperandIn keys = base.At(C), values = base.At(2 * static_cast<size_t>(C));
  const OperandIn dbase{dout + static_cast<size_t>(b) * T * C + h * HS, true, qkv.precision};

  LoadTile<N, HS, kKeys>(q, base, ld, q0, T);
  LoadTile<N, HS, kKeys>(dout_rows, dbase, C, q0, T);
  LoadTile<N, HS, kKeys>(k_tile(0), keys, ld, 0, T);
  LoadTile<N, HS, kKeys>(v_tile(0), values, ld, 0, T);
  CommitCopies();
  const int first = q0 + warp * 16, row0 = first + g;
  float row_lse[2], row_d[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = row0 + 8 * i;
    const size_t at = static_cast<size_t>(blockIdx.y) * T + r;
    row_lse[i] = r < T ? -lse[at] : 0.0f;
    row_d[i] = r < T ? D[at] : 0.0f;
  }
  const float scale2 = scale * kLog2e;
  float dq[1][HS / 8][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    const int stage = kt % 2;
    WaitCopies<0>();  // one barrier a tile, as the forward's
    __syncthreads();
    if (kt + 1 <= qt) {
      LoadTile<N, HS, kKeys>(k_tile(1 - stage), keys, ld, (kt + 1) * kKeys, T);
      LoadTile<N, HS, kKeys>(v_tile(1 - stage), values, ld, (kt + 1) * kKeys, T);
    }
    CommitCopies();
    const int k0 = kt * kKeys;
    // One key tile, compiled twice as the forward's is: whole and unmasked off the diagonal,
    // bounded and masked at run time on it.
    auto tile = [&](auto on_diagonal) {
      constexpr bool kDiagonal = decltype(on_diagonal)::value;
      const int pairs = kDiagonal ? PairsSeen(k0, first + 15, kBlocks / 2) : kBlocks / 2;
      // S = q k^T and dP = dout v^T, the warp's 16 rows by the tile's 64 keys.
      float s[1][kBlocks][4] = {}, dp[1][kBlocks][4] = {};
      const int rows = warp * 16 * L::kLd;
      TwoScoresProducts<N, HS>(s, dp, q + rows, dout_rows + rows, k_tile(stage), v_tile(stage), 0,
                               pairs);
      // dS / scale = P (dP - D) with P = exp(S scale - lse), into s; zero where masked (the
      // scale multiplies dq once at the end). Rows past T compute finite values (zero q and
      // dout) that are never stored.
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + j * 8 + 2 * t + e % 2;
          const int r = row0 + (e / 2) * 8;
          const bool visible = !kDiagonal || key <= r;
          const float p = visible ? FastExp2(fmaf(s[0][j][e], scale2, row_lse[e / 2])) : 0.0f;
          s[0][j][e] = p * (dp[0][j][e] - row_d[e / 2]);  // dS / scale
        }
      }
      // dq += dS k, k stepping through the keys; dS is zero past the pairs the rows see.
      AccumulateProduct<N, HS, 1>(dq, s, k_tile(stage), 0, pairs);
    };
    if (kt == qt) {
      tile(std::true_type{});
    } else {
      tile(std::false_type{});
    }
  }
  ScaleAccumulators<HS>(dq[0], scale);  // dS entered its product unscaled
  StoreRows<HS>(dqkv.At(static_cast<size_t>(b) * T * ld + h * HS), ld, first, T, dq[0]);
}

// Blocks of `rows`-row query (or key) tiles of one (b, h): x the tiles, y the B * NH heads.
dim3 Grid(int B, int T, int NH, int rows) {
  return dim3(static_cast<unsigned>((T + rows - 1) / rows), static_cast<unsigned>(B * NH));
}

// The floats of backward scratch before the narrowed dout: D, rounded up to 16 bytes.
size_t DotFloats(int B, int T, int NH) { return (static_cast<size_t>(B) * NH * T + 3) / 4 * 4; }

template <typename N, int HS>
void Forward(OperandOut out, float* state, OperandIn qkv, int B, int T, int C, int NH,
             const MmaAttentionTiles& tiles, cudaStream_t stream) {
  float* lse = state;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  WithForwardShape<HS>(tiles, [&](auto m, auto nb, auto q_shared) {
    constexpr int kM = decltype(m)::value, kNB = decltype(nb)::value;
    using F = ForwardTiles<HS, kM, kNB>;
    fused::LaunchWithShared(MmaForwardKernel<N, HS, kM, kNB, decltype(q_shared)::value>,
                            Grid(B, T, NH, F::kQueryRows), F::kBytes, stream, out, lse, qkv, T, C,
                            NH, scale);
  });
}

template <typename N, int HS>
void Backward(OperandOut dqkv, float* scratch, OperandIn dout, OperandIn out, const float* state,
              OperandIn qkv, int B, int T, int C, int NH, const MmaAttentionTiles& tiles,
              cudaStream_t stream) {
  const float* lse = state;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  float* dot = scratch;
  // The tiles copy dout as N: as it is where the projection's GEMM wrote it so, else a copy
  // narrowed in the pass that takes D.
  const N* dout_n = static_cast<const N*>(dout.data);
  if (dout.narrow) {
    fused::SoftmaxDot<N, HS>(dot, static_cast<N*>(nullptr), dout_n, out, B, T, C, NH, stream);
  } else {
    N* copy = reinterpret_cast<N*>(scratch + DotFloats(B, T, NH));
    fused::SoftmaxDot<N, HS>(dot, copy, static_cast<const float*>(dout.data), out, B, T, C, NH,
                             stream);
    dout_n = copy;
  }
  const dim3 grid = Grid(B, T, NH, kKeys);
  const float* d = dot;
  WithBackwardBlocks<HS>(tiles.dq_blocks, [&](auto blocks) {
    fused::LaunchWithShared(MmaDqKernel<N, HS, decltype(blocks)::value>, grid, Tiles<HS>::kDq,
                            stream, dqkv, dout_n, lse, d, qkv, T, C, NH, scale);
  });
  WithBackwardBlocks<HS>(tiles.dkv_blocks, [&](auto blocks) {
    fused::LaunchWithShared(MmaDkvKernel<N, HS, decltype(blocks)::value>, grid, Tiles<HS>::kDkv,
                            stream, dqkv, dout_n, lse, d, qkv, T, C, NH, scale);
  });
}

}  // namespace

bool MmaAttentionApplies(int C, int NH, Precision operands, const MmaAttentionTiles& tiles) {
  if (operands == Precision::kFp32 || NH <= 0 || C % NH != 0) return false;
  if (!fused::FusedHeadSize(C / NH)) return false;
  // The most dynamic shared memory one of the head size's kernels takes: HS = 64 takes
  // 56 KiB, which every GPU with mma.sync for bf16 (sm_80 on) gives a block; HS = 128 takes
  // 105 KiB, past sm_86/sm_89's 99 KiB.
  const size_t bytes =
      fused::ForHeadSize(C / NH, [&](auto hs) { return MostShared<decltype(hs)::value>(tiles); });
  return bytes <= fused::SharedOptIn();
}

size_t MmaAttentionScratchFloats(int B, int T, int C, int NH) {
  return DotFloats(B, T, NH) + (static_cast<size_t>(B) * T * C + 1) / 2;
}

void MmaAttentionForward(float* out, float* state, const float* qkv, int B, int T, int C, int NH,
                         Precision operands, bool narrow, const MmaAttentionTiles& tiles,
                         cudaStream_t stream) {
  const OperandOut o{out, narrow, operands};
  const OperandIn q{qkv, narrow, operands};
  DROVER_CUDA_REQUIRE(MmaAttentionApplies(C, NH, operands, tiles));
  fused::RequireShapes(qkv, qkv, B, T, C, NH);
  fused::ForKernel(operands, C / NH, [&](auto n, auto hs) {
    Forward<typename decltype(n)::type, decltype(hs)::value>(o, state, q, B, T, C, NH, tiles,
                                                             stream);
  });
}

void MmaAttentionBackward(float* dqkv, float* scratch, const float* dout, bool dout_narrow,
                          const float* out, const float* state, const float* qkv, int B, int T,
                          int C, int NH, Precision operands, bool narrow,
                          const MmaAttentionTiles& tiles, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(!dout_narrow || narrow);
  const OperandOut d{dqkv, narrow, operands};
  const OperandIn dy{dout, dout_narrow, operands};
  const OperandIn o{out, narrow, operands};
  const OperandIn q{qkv, narrow, operands};
  DROVER_CUDA_REQUIRE(MmaAttentionApplies(C, NH, operands, tiles));
  fused::RequireShapes(qkv, dout, B, T, C, NH);
  DROVER_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(scratch) % 16 == 0);
  fused::ForKernel(operands, C / NH, [&](auto n, auto hs) {
    Backward<typename decltype(n)::type, decltype(hs)::value>(d, scratch, dy, o, state, q, B, T, C,
                                                              NH, tiles, stream);
  });
}

}  // namespace drover::engine::cuda
