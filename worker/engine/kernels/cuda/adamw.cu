// AdamW, one fused elementwise pass (optim/adamw.h): m, v and the parameter in one read
// and one write each. Bias corrections come from the host (double, as the CPU path).
// AdamWUpdateChunks updates every segment of the arenas in one launch, a block per chunk
// (multi-tensor apply): GPT-2's decay groups are a hundred segments, a launch each before.
#include <algorithm>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;

// Element i of the arenas: the one update both kernels make, so their results are the same.
__device__ __forceinline__ void AdamWElement(float* params, const float* grads, float* m, float* v,
                                             size_t i, float lr, float weight_decay, float beta1,
                                             float beta2, float eps, float correction1,
                                             float correction2) {
  const float g = grads[i];
  const float mi = beta1 * m[i] + (1.0f - beta1) * g;
  const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
  m[i] = mi;
  v[i] = vi;
  const float m_hat = mi / correction1;
  const float v_hat = vi / correction2;
  params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
}

__global__ void AdamWKernel(float* params, const float* grads, float* m, float* v, size_t n,
                            float lr, float weight_decay, float beta1, float beta2, float eps,
                            float correction1, float correction2) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    AdamWElement(params, grads, m, v, i, lr, weight_decay, beta1, beta2, eps, correction1,
                 correction2);
  }
}

__global__ void AdamWChunksKernel(float* params, const float* grads, float* m, float* v,
                                  const AdamWChunk* chunks, float lr, float beta1, float beta2,
                                  float eps, float correction1, float correction2) {
  const AdamWChunk c = chunks[blockIdx.x];
  for (unsigned k = threadIdx.x; k < c.numel; k += blockDim.x) {
    AdamWElement(params, grads, m, v, c.offset + k, lr, c.weight_decay, beta1, beta2, eps,
                 correction1, correction2);
  }
}

}  // namespace

void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                 float weight_decay, float beta1, float beta2, float eps, float correction1,
                 float correction2, cudaStream_t stream) {
  if (n == 0) return;
  DROVER_LAUNCH(AdamWKernel, StrideBlocks(n, kThreads), kThreads, 0, stream)
  (params, grads, m, v, n, lr, weight_decay, beta1, beta2, eps, correction1, correction2);
  DROVER_CUDA_LAUNCHED();
}

std::vector<AdamWChunk> AdamWChunksOf(const AdamWSegment* segments, size_t count) {
  std::vector<AdamWChunk> chunks;
  for (size_t i = 0; i < count; ++i) {
    const AdamWSegment& s = segments[i];
    for (size_t at = 0; at < s.numel; at += kAdamWChunkElements) {
      const auto n = static_cast<unsigned>(std::min<size_t>(kAdamWChunkElements, s.numel - at));
      chunks.push_back({s.offset + at, n, s.weight_decay});
    }
  }
  return chunks;
}

void AdamWUpdateChunks(float* params, const float* grads, float* m, float* v,
                       const AdamWChunk* chunks, size_t count, float lr, float beta1, float beta2,
                       float eps, float correction1, float correction2, cudaStream_t stream) {
  if (count == 0) return;
  DROVER_CUDA_REQUIRE(count <= 2147483647u);  // grid.x
  DROVER_LAUNCH(AdamWChunksKernel, static_cast<unsigned>(count), kThreads, 0, stream)
  (params, grads, m, v, chunks, lr, beta1, beta2, eps, correction1, correction2);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
