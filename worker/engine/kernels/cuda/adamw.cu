// AdamW, one fused elementwise pass (optim/adamw.h): m, v and the parameter in one read
// and one write each. Bias corrections come from the host (double, as the CPU path).
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void AdamWKernel(float* params, const float* grads, float* m, float* v, size_t n,
                            float lr, float weight_decay, float beta1, float beta2, float eps,
                            float correction1, float correction2) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float g = grads[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / correction1;
    const float v_hat = vi / correction2;
    params[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * params[i]);
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

}  // namespace drover::engine::cuda
