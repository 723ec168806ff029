// Linear layers through cuBLAS (kernels/cpu/matmul.h). Row-major X (R, S) is column-major
// X^T (S, R) to cuBLAS, so each product is written transposed:
//   out^T (OC, N)     = W^T' (OC, C) . inp^T (C, N)      -> gemm(T, N), ldc = ldo
//   dinp^T (C, N)     = W^T (C, OC) . dout^T (OC, N)     -> gemm(N, N)
//   dweight^T (C, OC) = inp^T (C, N) . dout (N, OC)      -> gemm(N, T)
// The residual and bias are folded into the C operand (beta = 1), as on the CPU; the bias
// gradient is a deterministic column sum (column_sum.cuh).
//
// Precision: every operand is stored as fp32 holding values of the run's precision (ops.h),
// so a bf16 run multiplies with CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS converts the operands
// to bf16, exactly, and runs the tensor cores with fp32 accumulation, which gives the
// products an fp32 GEMM of the same values would. fp16 likewise; fp32 runs stay in
// pedantic fp32 (no TF32), the CPU reference's arithmetic.
#include "worker/engine/kernels/cuda/column_sum.cuh"
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

void Gemm(cublasHandle_t blas, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc,
          cublasComputeType_t compute) {
  const float alpha = 1.0f;
  DROVER_CUBLAS_CHECK(cublasGemmEx(blas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F,
                                   ldb, &beta, C, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

cublasComputeType_t GemmComputeType(Precision operands, bool narrow) {
  if (operands == Precision::kFp32) return CUBLAS_COMPUTE_32F_PEDANTIC;
  // An operand kept in fp32 (attention's probabilities) loses the least in TF32, the only
  // tensor-core format that reads fp32 without narrowing it to 8 or 11 significant bits.
  if (!narrow) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return operands == Precision::kBf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
}

void MatmulForward(cublasHandle_t blas, float* out, const float* inp, const float* weight,
                   const float* bias, const float* residual, int N, int C, int OC, int ldo,
                   Precision operands, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0 && ldo >= OC);
  float beta = 0.0f;
  if (bias != nullptr || residual != nullptr) {
    const size_t total = size_t{static_cast<unsigned>(N)} * OC;
    DROVER_LAUNCH(InitOutputKernel, StrideBlocks(total, kThreads), kThreads, 0, stream)
    (out, bias, residual, N, OC, ldo);
    DROVER_CUDA_LAUNCHED();
    beta = 1.0f;
  }
  Gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, beta, out, ldo,
       GemmComputeType(operands, true));
}

void MatmulBackward(cublasHandle_t blas, float* dinp, float* dweight, float* dbias,
                    const float* dout, const float* inp, const float* weight, int N, int C, int OC,
                    int ldo, bool accumulate, Precision operands, float* scratch,
                    cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0 && ldo >= OC);
  const cublasComputeType_t compute = GemmComputeType(operands, true);
  if (dinp != nullptr) {
    Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, ldo, 0.0f, dinp, C, compute);
  }
  Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, ldo, accumulate ? 1.0f : 0.0f,
       dweight, C, compute);
  if (dbias != nullptr) {
    ColumnSum(dbias, scratch, N, OC, RowMajorValue{dout, ldo}, accumulate, stream);
  }
}

}  // namespace drover::engine::cuda
