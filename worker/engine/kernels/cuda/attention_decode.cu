// A decoder's attention over its key/value cache (Ops::AttentionDecode, ops.h), in fp32: a
// few queries (one, when sampling a token) against every key before them. The training
// kernels tile (T, T); here a query is one row, so a block takes one (query, head) and its
// warps split the keys, each warp keeping an online softmax (running max, sum and weighted
// values) as the fused attention does, merged across the warps at the end. No shared memory
// that grows with the cache: any window length runs.
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr unsigned kThreads = kWarps * 32;
// Head dims a lane holds: head sizes up to 32 * kDimsPerLane.
constexpr int kDimsPerLane = 8;

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Block (query i, head h): out[i, h] from qkv (from + rows, 3C). Lane l holds dims l, l + 32,
// ... of the head; warp w takes keys w, w + kWarps, ... up to the query's position.
__global__ void AttentionDecodeKernel(float* out, const float* qkv, int from, int C, int HS,
                                      float scale) {
  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][32 * kDimsPerLane];
  const int i = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int t = from + i;  // the query's position: it sees keys 0..t
  const size_t stride = 3 * static_cast<size_t>(C);
  const float* q = qkv + t * stride + h * HS;
  float qd[kDimsPerLane], acc[kDimsPerLane];
#pragma unroll
  for (int k = 0; k < kDimsPerLane; ++k) {
    const int d = lane + 32 * k;
    qd[k] = d < HS ? q[d] * scale : 0.0f;
    acc[k] = 0.0f;
  }
  float max = -INFINITY, sum = 0.0f;
  for (int j = warp; j <= t; j += kWarps) {
    const float* key = qkv + j * stride + C + h * HS;
    const float* value = key + C;
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) {
      const int d = lane + 32 * k;
      if (d < HS) dot += qd[k] * key[d];
    }
    const float s = WarpSum(dot);
    // Online softmax: rescale what was summed when the max grows.
    const float next = fmaxf(max, s);
    const float shrink = expf(max - next);  // 0 for the first key (max = -inf)
    const float p = expf(s - next);
    sum = sum * shrink + p;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) {
      const int d = lane + 32 * k;
      acc[k] = acc[k] * shrink + (d < HS ? p * value[d] : 0.0f);
    }
    max = next;
  }
  if (lane == 0) {
    warp_max[warp] = max;
    warp_sum[warp] = sum;
  }
#pragma unroll
  for (int k = 0; k < kDimsPerLane; ++k) warp_acc[warp][lane + 32 * k] = acc[k];
  __syncthreads();
  // Merge the warps: a warp that saw no key (t < warp) has max -inf and adds nothing.
  float total_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) total_max = fmaxf(total_max, warp_max[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (warp_max[w] != -INFINITY) total += warp_sum[w] * expf(warp_max[w] - total_max);
  }
  for (int d = threadIdx.x; d < HS; d += kThreads) {
    float y = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_max[w] != -INFINITY) y += warp_acc[w][d] * expf(warp_max[w] - total_max);
    }
    out[static_cast<size_t>(i) * C + h * HS + d] = y / total;
  }
}

}  // namespace

void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH,
                     cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(from >= 0 && rows >= 1 && NH >= 1 && C % NH == 0);
  const int HS = C / NH;
  DROVER_CUDA_REQUIRE(HS <= 32 * kDimsPerLane);
  DROVER_CUDA_REQUIRE(NH <= 65535);  // grid.y
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  DROVER_LAUNCH(AttentionDecodeKernel, dim3(rows, NH), kThreads, 0, stream)
  (out, qkv, from, C, HS, scale);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
