// Linear layers through cuBLAS (kernels/cpu/matmul.h). Row-major X (R, S) is column-major
// X^T (S, R) to cuBLAS, so each product is written transposed:
//   out^T (OC, N)     = W^T' (OC, C) . inp^T (C, N)      -> gemm(T, N), ldc = ldo
//   dinp^T (C, N)     = W^T (C, OC) . dout^T (OC, N)     -> gemm(N, N)
//   dweight^T (C, OC) = inp^T (C, N) . dout (N, OC)      -> gemm(N, T)
// Mixed-precision forward GEMMs run through cuBLASLt (LtMatmul) with the bias in the epilogue
// and the residual as the C operand, one pass over out; where cuBLASLt has no algorithm, through
// cuBLAS with the residual and bias written into out first (beta = 1), as on the CPU. The bias
// gradient is a deterministic column sum (column_sum.cuh), taken in the same pass over dout as
// its 16-bit copy where the GEMMs read one.
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
#include <cstdio>

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

struct LtMatmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // c: C and D alike
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;

  ~Plan() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
  }
};

namespace {

// The largest power of two up to 256 that divides p's address: cuBLASLt's algorithms are
// chosen for the alignments they will be given, so the plan's key holds them.
int64_t AlignmentOf(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  int64_t a = 256;
  while (a > 1 && at % a != 0) a /= 2;
  return a;
}

// Set-up calls of a plan: a failure makes the plan unusable (the cuBLAS path takes over)
// rather than stopping the run.
bool Ok(cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; }

}  // namespace

LtMatmul::LtMatmul(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes)
    : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

LtMatmul::~LtMatmul() = default;

// In cuBLASLt's column-major terms, as the cuBLAS path: D^T (OC, N) = W^T' (OC, C) inp^T
// (C, N) + beta C^T, with A = weight stored (C, OC), B = inp stored (C, N), C = residual and
// D = out stored (OC, N) with leading dimension ldo; the bias is per row of D.
LtMatmul::Plan* LtMatmul::PlanFor(GemmOutput out, GemmOperand inp, GemmOperand weight,
                                  GemmOperand bias, const float* residual, int N, int C, int OC,
                                  int ldo, cublasComputeType_t compute) {
  const std::vector<int64_t> key = {N,
                                    C,
                                    OC,
                                    ldo,
                                    static_cast<int64_t>(compute),
                                    static_cast<int64_t>(inp.type),
                                    static_cast<int64_t>(weight.type),
                                    static_cast<int64_t>(out.type),
                                    static_cast<int64_t>(bias.type),
                                    bias.data != nullptr ? AlignmentOf(bias.data) : 0,
                                    residual != nullptr ? AlignmentOf(residual) : 0,
                                    AlignmentOf(weight.data),
                                    AlignmentOf(inp.data),
                                    AlignmentOf(out.data)};
  std::unique_ptr<Plan>& slot = plans_[key];
  if (slot != nullptr) return slot.get();
  slot = std::make_unique<Plan>();
  Plan& p = *slot;
  const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  const uint32_t epilogue =
      bias.data != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  const int32_t bias_type = bias.type;
  bool ok = Ok(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F)) &&
            Ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                              sizeof(trans_a))) &&
            Ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                              sizeof(trans_b))) &&
            Ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof(epilogue)));
  if (ok && bias.data != nullptr) {
    // The heuristic reads the pointer's alignment; each call sets the pointer again.
    ok = Ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.data,
                                           sizeof(bias.data))) &&
         Ok(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                           sizeof(bias_type)));
  }
  ok = ok && Ok(cublasLtMatrixLayoutCreate(&p.a, weight.type, C, OC, C)) &&
       Ok(cublasLtMatrixLayoutCreate(&p.b, inp.type, C, N, C)) &&
       Ok(cublasLtMatrixLayoutCreate(&p.c, out.type, OC, N, ldo));
  cublasLtMatmulPreference_t pref = nullptr;
  ok = ok && Ok(cublasLtMatmulPreferenceCreate(&pref));
  if (ok) {
    const uint64_t workspace = workspace_bytes_;
    // C is out itself when there is no residual (beta 0): D's alignment serves for both.
    const uint32_t aligns[4] = {
        static_cast<uint32_t>(AlignmentOf(weight.data)),
        static_cast<uint32_t>(AlignmentOf(inp.data)),
        static_cast<uint32_t>(AlignmentOf(residual != nullptr ? residual : out.data)),
        static_cast<uint32_t>(AlignmentOf(out.data))};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    ok = Ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace, sizeof(workspace)));
    for (int i = 0; i < 4 && ok; ++i) {
      ok = Ok(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &aligns[i], sizeof(aligns[i])));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  ok = ok &&
       Ok(cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result,
                                         &found)) &&
       found == 1 && Ok(result.state) && result.workspaceSize <= workspace_bytes_;
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  p.algo = result.algo;
  p.usable = ok;
  if (!ok) {
    std::fprintf(stderr,
                 "drover cuda: cuBLASLt has no algorithm for the forward GEMM N=%d C=%d OC=%d "
                 "ldo=%d%s%s%s%s; it runs through cuBLAS\n",
                 N, C, OC, ldo, inp.type == CUDA_R_32F ? "" : " (16-bit inputs)",
                 out.type == CUDA_R_32F ? "" : " (16-bit output)",
                 bias.data != nullptr ? " +bias" : "", residual != nullptr ? " +residual" : "");
  }
  return &p;
}

bool LtMatmul::Forward(GemmOutput out, GemmOperand inp, GemmOperand weight, GemmOperand bias,
                       const float* residual, int N, int C, int OC, int ldo,
                       cublasComputeType_t compute, cudaStream_t stream) {
  Plan* p = PlanFor(out, inp, weight, bias, residual, N, C, OC, ldo, compute);
  if (!p->usable) return false;
  if (bias.data != nullptr) {
    DROVER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias.data, sizeof(bias.data)));
  }
  const float alpha = 1.0f, beta = residual != nullptr ? 1.0f : 0.0f;
  const void* c = residual != nullptr ? residual : out.data;
  DROVER_CUBLAS_CHECK(cublasLtMatmul(lt_, p->desc, &alpha, weight.data, p->a, inp.data, p->b, &beta,
                                     c, p->c, out.data, p->c, &p->algo, workspace_,
                                     workspace_bytes_, stream));
  return true;
}

void MatmulForward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* out,
                   bool out_narrow, const float* inp, const float* weight, const float* bias,
                   const float* residual, int N, int C, int OC, int ldo, Precision operands,
                   cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && OC > 0 && ldo >= OC);
  const GemmInputs in = InputsOf(staging, operands, stream);
  DROVER_CUDA_REQUIRE(!out_narrow || in.staged);
  DROVER_CUDA_REQUIRE(!out_narrow || residual == nullptr);
  const GemmOperand w = in.Of(&GemmStaging::weight, weight, size_t{static_cast<unsigned>(OC)} * C);
  const GemmOperand x = in.Buffer(inp);
  // A 16-bit out takes a bias of its type in the epilogue: a copy, exact (the parameters hold
  // values of the run's precision, NarrowedParams), added in fp32 before out is rounded.
  GemmOperand b = Fp32(bias);
  if (out_narrow && bias != nullptr) b = in.Of(&GemmStaging::bias, bias, OC);
  const GemmOutput o{out, out_narrow ? in.NarrowType() : CUDA_R_32F};
  // fp32 runs keep cuBLAS's pedantic fp32, the CPU reference's arithmetic (cuBLASLt is not
  // documented to take CUBLAS_COMPUTE_32F_PEDANTIC); mixed precision, the fast path, takes Lt.
  if (lt != nullptr && operands != Precision::kFp32 &&
      lt->Forward(o, x, w, b, residual, N, C, OC, ldo, in.compute, stream)) {
    return;
  }
  // cuBLAS: out = [residual + bias] + the product, in floats; a 16-bit out is written so into
  // a scratch holding its widened values (the columns past OC keep theirs), then narrowed.
  const size_t span = size_t{static_cast<unsigned>(N - 1)} * ldo + OC;
  float* f = out_narrow ? staging->output.Get(span) : out;
  if (out_narrow) WidenCopy(f, out, span, operands, stream);
  float beta = 0.0f;
  if (bias != nullptr || residual != nullptr) {
    const size_t total = size_t{static_cast<unsigned>(N)} * OC;
    DROVER_LAUNCH(InitOutputKernel, StrideBlocks(total, kThreads), kThreads, 0, stream)
    (f, bias, residual, N, OC, ldo);
    DROVER_CUDA_LAUNCHED();
    beta = 1.0f;
  }
  Gemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, x, C, beta, GemmOutput{f, CUDA_R_32F}, ldo,
       in.compute);
  if (out_narrow) NarrowCopy(out, f, span, operands, stream);
}

void MatmulBackward(cublasHandle_t blas, GemmStaging* staging, float* dinp, bool dinp_narrow,
                    float* dweight, float* dbias, const float* dout, bool dout_narrow,
                    const float* inp, const float* weight, int N, int C, int OC, int ldo,
                    bool accumulate, Precision operands, float* scratch, cudaStream_t stream) {
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
    Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dy, ldo, 0.0f, d, C, in.compute);
  }
  const GemmOperand x = in.Buffer(inp);
  Gemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x, C, dy, ldo, accumulate ? 1.0f : 0.0f,
       GemmOutput{dweight, CUDA_R_32F}, C, in.compute);
  if (dbias != nullptr && !fused) {
    ColumnSum(dbias, scratch, OperandIn{dout, dout_narrow, operands}, N, OC, ldo, accumulate,
              stream);
  }
}

}  // namespace drover::engine::cuda
