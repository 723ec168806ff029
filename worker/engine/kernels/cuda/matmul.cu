// Linear layers through cuBLAS sgemm (kernels/cpu/matmul.h). Row-major X (R, S) is
// column-major X^T (S, R) to cuBLAS, so each product is written transposed:
//   out^T (OC, N)     = W^T' (OC, C) . inp^T (C, N)      -> gemm(T, N), ldc = ldo
//   dinp^T (C, N)     = W^T (C, OC) . dout^T (OC, N)     -> gemm(N, N)
//   dweight^T (C, OC) = inp^T (C, N) . dout (N, OC)      -> gemm(N, T)
// The residual and bias are folded into the C operand (beta = 1), as on the CPU; the bias
// gradient is a column sum over rows, one thread per column (deterministic).
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;

// out (N, OC; row stride ldo) = [residual] + [bias], the gemm's C operand.
__global__ void InitOutputKernel(float* out, const float* bias, const float* residual, int N,
                                 int OC, int ldo) {
  const size_t total = size_t{static_cast<unsigned>(N)} * OC;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t n = i / OC;
    const int oc = static_cast<int>(i % OC);
    const size_t at = n * ldo + oc;
    float v = residual != nullptr ? residual[at] : 0.0f;
    if (bias != nullptr) v += bias[oc];
    out[at] = v;
  }
}

__global__ void BiasGradKernel(float* dbias, const float* dout, int N, int OC, int ldo,
                               bool accumulate) {
  const int oc = blockIdx.x * blockDim.x + threadIdx.x;
  if (oc >= OC) return;
  float sum = 0;
  for (int n = 0; n < N; ++n) sum += dout[static_cast<size_t>(n) * ldo + oc];
  dbias[oc] = accumulate ? dbias[oc] + sum : sum;
}

}  // namespace

void MatmulForward(cublasHandle_t blas, float* out, const float* inp, const float* weight,
                   const float* bias, const float* residual, int N, int C, int OC, int ldo,
                   cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0 && ldo >= OC);
  float beta = 0.0f;
  if (bias != nullptr || residual != nullptr) {
    const size_t total = size_t{static_cast<unsigned>(N)} * OC;
    InitOutputKernel<<<StrideBlocks(total, kThreads), kThreads, 0, stream>>>(out, bias, residual, N,
                                                                             OC, ldo);
    DROVER_CUDA_LAUNCHED();
    beta = 1.0f;
  }
  const float alpha = 1.0f;
  DROVER_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &alpha, weight, C, inp,
                                  C, &beta, out, ldo));
}

void MatmulBackward(cublasHandle_t blas, float* dinp, float* dweight, float* dbias,
                    const float* dout, const float* inp, const float* weight, int N, int C, int OC,
                    int ldo, bool accumulate, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0 && ldo >= OC);
  const float one = 1.0f, zero = 0.0f;
  if (dinp != nullptr) {
    DROVER_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout,
                                    ldo, &zero, dinp, C));
  }
  const float beta = accumulate ? 1.0f : 0.0f;
  DROVER_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, ldo,
                                  &beta, dweight, C));
  if (dbias != nullptr) {
    BiasGradKernel<<<Blocks(OC, kThreads), kThreads, 0, stream>>>(dbias, dout, N, OC, ldo,
                                                                  accumulate);
    DROVER_CUDA_LAUNCHED();
  }
}

}  // namespace drover::engine::cuda
