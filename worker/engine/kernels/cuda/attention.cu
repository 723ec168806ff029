// Causal multi-head attention over packed qkv (kernels/cpu/attention.h): a simple, correct
// kernel set first (one warp per query row, the (B, NH, T, T) probabilities materialised as
// on the CPU); a fused flash-style kernel is the next step. The backward runs in two
// passes so that no two warps ever add into the same element: pass 1 (per query row t)
// writes the softmax's input gradient dpre and dq_t; pass 2 (per key row t2) sums dk_t2
// and dv_t2 over the rows t >= t2 that saw it. Deterministic.
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 4;

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Row `row` of the (B, NH, T) query rows: b, h, t.
struct RowIndex {
  int b, h, t;
};
__device__ RowIndex Unpack(int row, int NH, int T) {
  return {row / (NH * T), (row / T) % NH, row % T};
}

__global__ void AttentionForwardKernel(float* out, float* att, const float* qkv, int B, int T,
                                       int C, int NH, float scale) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= B * NH * T) return;
  const RowIndex r = Unpack(row, NH, T);
  const int HS = C / NH;
  const size_t stride = 3 * static_cast<size_t>(C);
  const float* base = qkv + static_cast<size_t>(r.b) * T * stride + r.h * HS;
  const float* q = base + static_cast<size_t>(r.t) * stride;
  float* a = att + static_cast<size_t>(row) * T;
  float maxv = -INFINITY;
  for (int t2 = lane; t2 <= r.t; t2 += 32) {
    const float* k = base + static_cast<size_t>(t2) * stride + C;
    float dot = 0;
    for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
    dot *= scale;
    a[t2] = dot;
    maxv = fmaxf(maxv, dot);
  }
  maxv = WarpMax(maxv);
  float sum = 0;
  for (int t2 = lane; t2 <= r.t; t2 += 32) {
    const float e = expf(a[t2] - maxv);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpSum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= r.t ? a[t2] * inv : 0.0f;
  __syncwarp();  // every lane's probabilities are read by every lane below
  float* o = out + (static_cast<size_t>(r.b) * T + r.t) * C + r.h * HS;
  for (int i = lane; i < HS; i += 32) {
    float acc = 0;
    for (int t2 = 0; t2 <= r.t; ++t2)
      acc += a[t2] * base[static_cast<size_t>(t2) * stride + 2 * C + i];
    o[i] = acc;
  }
}

// Pass 1, one warp per query row t: dpre[t][t2] = att (datt - sum att datt) scale, and dq_t.
__global__ void AttentionBackwardRows(float* dqkv, float* dpre, const float* dout, const float* att,
                                      const float* qkv, int B, int T, int C, int NH, float scale) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= B * NH * T) return;
  const RowIndex r = Unpack(row, NH, T);
  const int HS = C / NH;
  const size_t stride = 3 * static_cast<size_t>(C);
  const float* base = qkv + static_cast<size_t>(r.b) * T * stride + r.h * HS;
  const float* a = att + static_cast<size_t>(row) * T;
  const float* d = dout + (static_cast<size_t>(r.b) * T + r.t) * C + r.h * HS;
  float* dp = dpre + static_cast<size_t>(row) * T;
  float weighted = 0;
  for (int t2 = lane; t2 <= r.t; t2 += 32) {
    const float* v = base + static_cast<size_t>(t2) * stride + 2 * C;
    float datt = 0;
    for (int i = 0; i < HS; ++i) datt += d[i] * v[i];
    dp[t2] = datt;
    weighted += a[t2] * datt;
  }
  weighted = WarpSum(weighted);
  for (int t2 = lane; t2 < T; t2 += 32)
    dp[t2] = t2 <= r.t ? a[t2] * (dp[t2] - weighted) * scale : 0.0f;
  __syncwarp();
  float* dq = dqkv + (static_cast<size_t>(r.b) * T + r.t) * stride + r.h * HS;
  for (int i = lane; i < HS; i += 32) {
    float acc = 0;
    for (int t2 = 0; t2 <= r.t; ++t2)
      acc += dp[t2] * base[static_cast<size_t>(t2) * stride + C + i];
    dq[i] = acc;
  }
}

// Pass 2, one warp per key row t2: dk_t2 = sum_t dpre[t][t2] q_t, dv_t2 = sum_t att[t][t2] dout_t.
__global__ void AttentionBackwardKeys(float* dqkv, const float* dpre, const float* dout,
                                      const float* att, const float* qkv, int B, int T, int C,
                                      int NH) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= B * NH * T) return;
  const RowIndex r = Unpack(row, NH, T);  // r.t is the key position t2
  const int HS = C / NH;
  const size_t stride = 3 * static_cast<size_t>(C);
  const float* base = qkv + static_cast<size_t>(r.b) * T * stride + r.h * HS;
  const size_t head = (static_cast<size_t>(r.b) * NH + r.h) * T * T;
  float* dk = dqkv + (static_cast<size_t>(r.b) * T + r.t) * stride + r.h * HS + C;
  float* dv = dk + C;
  for (int i = lane; i < HS; i += 32) {
    float acck = 0, accv = 0;
    for (int t = r.t; t < T; ++t) {
      const size_t at = head + static_cast<size_t>(t) * T + r.t;
      acck += dpre[at] * base[static_cast<size_t>(t) * stride + i];
      accv += att[at] * dout[(static_cast<size_t>(r.b) * T + t) * C + r.h * HS + i];
    }
    dk[i] = acck;
    dv[i] = accv;
  }
}

}  // namespace

void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                      cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && NH > 0 && C % NH == 0);
  const float scale = 1.0f / sqrtf(static_cast<float>(C / NH));
  const int rows = B * NH * T;
  AttentionForwardKernel<<<Blocks(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      out, att, qkv, B, T, C, NH, scale);
  DROVER_CUDA_LAUNCHED();
}

void AttentionBackward(float* dqkv, float* dpre, const float* dout, const float* att,
                       const float* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && NH > 0 && C % NH == 0);
  const float scale = 1.0f / sqrtf(static_cast<float>(C / NH));
  const int rows = B * NH * T;
  AttentionBackwardRows<<<Blocks(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      dqkv, dpre, dout, att, qkv, B, T, C, NH, scale);
  DROVER_CUDA_LAUNCHED();
  AttentionBackwardKeys<<<Blocks(rows, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(
      dqkv, dpre, dout, att, qkv, B, T, C, NH);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
