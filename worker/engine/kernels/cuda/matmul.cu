// Linear layers through cuBLAS (kernels/cpu/matmul.h). Row-major X (R, S) is column-major
// X^T (S, R) to cuBLAS, so each product is written transposed:
//   out^T (OC, N)     = W^T' (OC, C) . inp^T (C, N)      -> gemm(T, N), ldc = ldo
//   dinp^T (C, N)     = W^T (C, OC) . dout^T (OC, N)     -> gemm(N, N)
//   dweight^T (C, OC) = inp^T (C, N) . dout (N, OC)      -> gemm(N, T)
// Mixed-precision forward GEMMs run through cuBLASLt (lt_matmul.cu) with the bias in the
// epilogue and the residual as the C operand, one pass over out; where cuBLASLt has no
// algorithm, through cuBLAS with the residual and bias written into out first (beta = 1), as
// on the CPU. The MLP's GEMMs next to GELU take GELU into cuBLASLt's epilogue likewise
// (MatmulGeluForward, GeluMatmulBackward), else GELU's own kernels (gelu.cu) after them. The
// bias gradient of a 16-bit dout comes from the weight gradient GEMM's epilogue
// (CUBLASLT_EPILOGUE_BGRADB: in its pass over dout, where a column sum read dout again);
// elsewhere (a float dout, fp32 runs, no algorithm) it is a deterministic column sum
// (column_sum.cuh), taken in the same pass over dout as its 16-bit copy where the GEMMs read
// one.
//
// Precision: every operand holds values of the run's precision (ops.h). In a bf16 run the
// activations arrive as bf16 operand buffers (ops.h: the table's format for what only GEMMs
// read), and the operands that are floats (the weights, the residual stream's gradient) are
// first copied to bf16 matrices (GemmStaging: exact, one pass over each); cuBLAS then
// multiplies bf16 by bf16 with fp32 accumulation, the tensor cores' native inputs at half
// the bytes, in the kernels it tunes most. The products equal those of an fp32 GEMM of the
// same values. With DROVER_CUDA_GEMM_INPUTS=fp32 the operand buffers are floats and cuBLAS
// reads every operand as fp32 with CUBLAS_COMPUTE_32F_FAST_16BF, narrowing as it goes, which
// gives the same products; the device check's speed step times both. fp16 likewise; fp32
// runs stay in pedantic fp32 (no TF32), the CPU reference's arithmetic.
#include <cstdint>

#include "worker/engine/kernels/cuda/column_sum.cuh"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

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

// C: floats, or (beta 0, 16-bit inputs) an operand buffer of the inputs' type.
void Gemm(cublasHandle_t blas, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          GemmOperand A, int lda, GemmOperand B, int ldb, float beta, GemmOutput C, int ldc,
          cublasComputeType_t compute) {
  const float alpha = 1.0f;
  DROVER_CUBLAS_CHECK(cublasGemmEx(blas, ta, tb, m, n, k, &alpha, A.data, A.type, lda, B.data,
                                   B.type, ldb, &beta, C.data, C.type, ldc, compute,
                                   CUBLAS_GEMM_DEFAULT));
}

GemmOperand Fp32(const float* x) { return {x, CUDA_R_32F}; }

// The operands of one GEMM as cuBLAS will read them, and its compute type.
struct GemmInputs {
  bool staged;  // 16-bit copies (GemmStaging) rather than the fp32 storage
  cublasComputeType_t compute;
  Precision precision;
  GemmStaging* staging;
  cudaStream_t stream;

  cudaDataType_t NarrowType() const {
    return precision == Precision::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  }
  // An operand buffer (ops.h) as an operand: 16-bit exactly when the GEMM is staged.
  GemmOperand Buffer(const float* x) const {
    return staged ? GemmOperand{x, NarrowType()} : Fp32(x);
  }
  // x (n elements) as an operand: as it is where it is already 16-bit (`narrow`: an operand
  // buffer, ops.h), else its 16-bit copy in `copy` when staged, else the fp32 storage.
  GemmOperand Of(Scratch<uint16_t> GemmStaging::*copy, const float* x, size_t n,
                 bool narrow = false) const {
    if (narrow) return {x, NarrowType()};
    if (!staged) return Fp32(x);
    uint16_t* out = (staging->*copy).Get(n);
    NarrowCopy(out, x, n, precision, stream);
    return {out, NarrowType()};
  }
};

GemmInputs InputsOf(GemmStaging* staging, Precision operands, cudaStream_t stream) {
  const bool staged = staging != nullptr && operands != Precision::kFp32;
  // 16-bit inputs with fp32 accumulation take the tensor cores under plain COMPUTE_32F.
  return {staged, staged ? CUBLAS_COMPUTE_32F : GemmComputeType(operands, true), operands, staging,
          stream};
}

}  // namespace

cublasComputeType_t GemmComputeType(Precision operands, bool narrow) {
  if (operands == Precision::kFp32) return CUBLAS_COMPUTE_32F_PEDANTIC;
  // An operand kept in fp32 (attention's probabilities) loses the least in TF32, the only
  // tensor-core format that reads fp32 without narrowing it to 8 or 11 significant bits.
  if (!narrow) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return operands == Precision::kBf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F;
}

namespace {

// A forward GEMM's operands as cuBLAS reads them (GemmInputs: 16-bit copies of the weight and
// the bias made here where the GEMM is staged).
struct ForwardOperands {
  GemmOperand weight, inp, bias;
};

ForwardOperands OperandsOf(const GemmInputs& in, const float* inp, const float* weight,
                           const float* bias, int C, int OC, bool out_narrow) {
  ForwardOperands op{in.Of(&GemmStaging::weight, weight, size_t{static_cast<unsigned>(OC)} * C),
                     in.Buffer(inp), Fp32(bias)};
  // A 16-bit out takes a bias of its type in the epilogue: a copy, exact (the parameters hold
  // values of the run's precision, NarrowedParams), added in fp32 before out is rounded.
  if (out_narrow && bias != nullptr) op.bias = in.Of(&GemmStaging::bias, bias, OC);
  return op;
}

// out = [residual] + [bias] + inp weight^T, from op (bias and residual: the fp32 ones, which
// the cuBLAS path reads).
void Forward(cublasHandle_t blas, LtMatmul* lt, const GemmInputs& in, const ForwardOperands& op,
             float* out, bool out_narrow, const float* bias, const float* residual, int N, int C,
             int OC, int ldo) {
  const GemmOutput o{out, out_narrow ? in.NarrowType() : CUDA_R_32F};
  // fp32 runs keep cuBLAS's pedantic fp32, the CPU reference's arithmetic (cuBLASLt is not
  // documented to take CUBLAS_COMPUTE_32F_PEDANTIC); mixed precision, the fast path, takes Lt.
  if (lt != nullptr && in.precision != Precision::kFp32 &&
      lt->Forward(o, op.inp, op.weight, op.bias, residual, N, C, OC, ldo, in.compute, in.stream)) {
    return;
  }
  // cuBLAS: out = [residual + bias] + the product, in floats; a 16-bit out is written so into
  // a scratch holding its widened values (the columns past OC keep theirs), then narrowed.
  const size_t span = size_t{static_cast<unsigned>(N - 1)} * ldo + OC;
  float* f = out_narrow ? in.staging->output.Get(span) : out;
  if (out_narrow) WidenCopy(f, out, span, in.precision, in.stream);
  float beta = 0.0f;
  if (bias != nullptr || residual != nullptr) {
    const size_t total = size_t{static_cast<unsigned>(N)} * OC;
    DROVER_LAUNCH(InitOutputKernel, StrideBlocks(total, kThreads), kThreads, 0, in.stream)
    (f, bias, residual, N, OC, ldo);
    DROVER_CUDA_LAUNCHED();
    beta = 1.0f;
  }
  Gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, op.weight, C, op.inp, C, beta,
       GemmOutput{f, CUDA_R_32F}, ldo, in.compute);
  if (out_narrow) NarrowCopy(out, f, span, in.precision, in.stream);
}

// MatmulBackward, and with pre (an operand buffer, N x C) GeluMatmulBackward: dinp is then
// multiplied by GELU's slope at pre, in cuBLASLt's epilogue where both are 16-bit and it has
// an algorithm, else by GELU's backward kernel in place after the GEMM.
void Backward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* dinp,
              bool dinp_narrow, float* dweight, float* dbias, const float* dout, bool dout_narrow,
              const float* inp, const float* weight, const float* pre, int N, int C, int OC,
              int ldo, bool accumulate, Precision operands, float* scratch, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0 && ldo >= OC);
  const GemmInputs in = InputsOf(staging, operands, stream);
  DROVER_CUDA_REQUIRE((!dout_narrow && !dinp_narrow) || in.staged);
  // dout's rows are ldo apart: its copy spans the first row's start to the last's OC columns.
  const size_t span = size_t{static_cast<unsigned>(N - 1)} * ldo + OC;
  // Floats that the GEMMs read as a 16-bit copy: the copy and the bias gradient in one read
  // of dout (the bias sums the narrowed values, which are what a float dout holds, ops.h).
  const bool fused = dbias != nullptr && in.staged && !dout_narrow;
  GemmOperand dy;
  if (fused) {
    uint16_t* copy = staging->output_grad.Get(span);
    NarrowCopyAndColumnSum(copy, dbias, scratch, dout, N, OC, ldo, operands, accumulate, stream);
    dy = {copy, in.NarrowType()};
  } else {
    dy = in.Of(&GemmStaging::output_grad, dout, span, dout_narrow);
  }
  if (dinp != nullptr) {
    const GemmOperand w =
        in.Of(&GemmStaging::weight, weight, size_t{static_cast<unsigned>(OC)} * C);
    const GemmOutput d{dinp, dinp_narrow ? in.NarrowType() : CUDA_R_32F};
    const bool epilogue = pre != nullptr && lt != nullptr && dinp_narrow &&
                          lt->DgeluBackward(d, dy, ldo, w, GemmOperand{pre, in.NarrowType()}, N, C,
                                            OC, in.compute, stream);
    if (!epilogue) {
      Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dy, ldo, 0.0f, d, C, in.compute);
      if (pre != nullptr) {
        GeluBackward(dinp, pre, dinp, size_t{static_cast<unsigned>(N)} * C, operands, dinp_narrow,
                     stream);
      }
    }
  }
  const GemmOperand x = in.Buffer(inp);
  // A 16-bit dout not copied here: its bias gradient in the weight gradient GEMM's epilogue,
  // straight into dbias, or where dbias accumulates into scratch and then added (cuBLASLt
  // writes the sums; it cannot add them).
  float* const sums = accumulate ? scratch : dbias;
  if (dbias != nullptr && !fused && dout_narrow && lt != nullptr &&
      lt->WeightGradient(dweight, sums, dy, ldo, x, N, C, OC, accumulate, in.compute, stream)) {
    if (accumulate) ColumnSumFinish(dbias, scratch, 1, OC, true, stream);
    return;
  }
  Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x, C, dy, ldo, accumulate ? 1.0f : 0.0f,
       GemmOutput{dweight, CUDA_R_32F}, C, in.compute);
  if (dbias != nullptr && !fused) {
    ColumnSum(dbias, scratch, OperandIn{dout, dout_narrow, operands}, N, OC, ldo, accumulate,
              stream);
  }
}

}  // namespace

void MatmulForward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* out,
                   bool out_narrow, const float* inp, const float* weight, const float* bias,
                   const float* residual, int N, int C, int OC, int ldo, Precision operands,
                   cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0 && ldo >= OC);
  const GemmInputs in = InputsOf(staging, operands, stream);
  DROVER_CUDA_REQUIRE(!out_narrow || in.staged);
  DROVER_CUDA_REQUIRE(!out_narrow || residual == nullptr);
  const ForwardOperands op = OperandsOf(in, inp, weight, bias, C, OC, out_narrow);
  Forward(blas, lt, in, op, out, out_narrow, bias, residual, N, C, OC, ldo);
}

void MatmulGeluForward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* out,
                       float* pre, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC, Precision operands, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0);
  const GemmInputs in = InputsOf(staging, operands, stream);
  const ForwardOperands op = OperandsOf(in, inp, weight, bias, C, OC, in.staged);
  const GemmOutput o{out, in.NarrowType()}, p{pre, in.NarrowType()};
  if (in.staged && lt != nullptr &&
      lt->GeluForward(o, p, op.inp, op.weight, op.bias, N, C, OC, in.compute, stream)) {
    return;
  }
  Forward(blas, lt, in, op, pre, in.staged, bias, nullptr, N, C, OC, OC);
  GeluForward(out, pre, size_t{static_cast<unsigned>(N)} * OC, operands, in.staged, stream);
}

void MatmulBackward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* dinp,
                    bool dinp_narrow, float* dweight, float* dbias, const float* dout,
                    bool dout_narrow, const float* inp, const float* weight, int N, int C, int OC,
                    int ldo, bool accumulate, Precision operands, float* scratch,
                    cudaStream_t stream) {
  Backward(blas, lt, staging, dinp, dinp_narrow, dweight, dbias, dout, dout_narrow, inp, weight,
           nullptr, N, C, OC, ldo, accumulate, operands, scratch, stream);
}

void GeluMatmulBackward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* dpre,
                        float* dweight, float* dbias, const float* dout, bool dout_narrow,
                        const float* inp, const float* weight, const float* pre, int N, int C,
                        int OC, bool accumulate, Precision operands, float* scratch,
                        cudaStream_t stream) {
  const bool narrow = InputsOf(staging, operands, stream).staged;
  Backward(blas, lt, staging, dpre, narrow, dweight, dbias, dout, dout_narrow, inp, weight, pre, N,
           C, OC, OC, accumulate, operands, scratch, stream);
}

}  // namespace drover::engine::cuda
