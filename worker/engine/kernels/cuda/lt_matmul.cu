// cuBLASLt's matmul for the GEMMs that gain from an epilogue (LtMatmul, ops_cuda.h): the
// forward GEMMs with the bias in the epilogue and the residual as the C operand, and the two
// GEMMs next to the MLP's GELU with GELU folded in, as llm.c does on H100:
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS writes the fc GEMM's output both as it is (aux: the
// pre-activation backward reads) and through GELU (D), and CUBLASLT_EPILOGUE_DGELU multiplies
// the fcproj input gradient by GELU's slope at that pre-activation. On an H200 (GPT-2 124M,
// batch 32, bf16) the separate GELU kernels took 1.35 ms forward and 1.86 ms backward of a
// 76 ms step; the epilogues save most of both passes over the (B*T, 4C) activation. And the
// weight gradient GEMMs of a 16-bit dout take the bias gradient into their epilogue
// (CUBLASLT_EPILOGUE_BGRADB, as NVIDIA's Transformer Engine does): the bias gradients' column
// sums, another read of each dout, took 1.95 ms of that step. cuBLASLt sums in an order of
// its own, repeatably for one shape and algorithm; the column sums' order was fixed by the
// shape alone.
//
// Which GELU: cuBLASLt's documentation (cublasLtEpilogue_t; cublasLt.h of CUDA 13.0) says
// only "GELU" and gives no formula. PyTorch's torch._addmm_activation(use_gelu=True) runs
// this epilogue on CUDA and is taken there to be the tanh approximation (its CPU version
// computes erf's), and llm.c fuses it into a model whose GELU is the tanh one, as drover's is
// (kernels/cpu/gelu.h). Only a GPU can confirm it: CudaOpsTest's
// MatmulGeluFusedMatchesTheCpusSeparateOps compares the epilogue with the CPU's GELU on
// pre-activations below -4, where the tanh form and erf's differ by 45%.
//
// Numerics differ from the separate kernels by design: the forward epilogue takes GELU of the
// fp32 accumulator, where GeluForward reads the pre-activation rounded to bf16 / fp16, and
// DGELU multiplies the fp32 product by the slope before rounding, where GeluBackward reads
// the rounded product. Each removes one rounding step of the run's 16-bit type.
//
// Each shape, type, epilogue and alignment gets a plan once (descriptors and the heuristic's
// algorithm). A plan cuBLASLt refuses is kept as unusable and the caller takes its other path
// (cuBLAS, and GELU's own kernels), so a device or library without an algorithm slows a run
// rather than stopping it; the first refusal of each plan is reported on stderr.
#include <cstdint>
#include <cstdio>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {

// One cuBLASLt matmul in its column-major terms: D (m, n; ld ldd) = epilogue(op(A) (m, k)
// op(B) (k, n) + [bias] (m)) [+ C], with C an fp32 matrix in D's layout (beta 1) or absent
// (beta 0), and the epilogue's aux matrix (m, n) in D's type with D's leading dimension; or
// with BGRADB, `bias` (n, D's type) written with op(B)'s column sums.
struct LtMatmul::Call {
  const char* what;      // for the refusal's message
  const char* fallback;  // likewise: what runs instead
  cublasOperation_t trans_a, trans_b;
  int m, n, k;
  GemmOperand a;
  int lda;
  GemmOperand b;
  int ldb;
  const float* c;
  GemmOutput d;
  int ldd;
  uint32_t epilogue;
  GemmOperand bias;  // data null: none
  const void* aux;   // null: none
  cublasComputeType_t compute;
};

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

// Set-up calls of a plan: a failure makes the plan unusable (the other path takes over)
// rather than stopping the run.
bool Ok(cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS; }

template <typename T>
bool SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  return Ok(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

}  // namespace

LtMatmul::LtMatmul(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes)
    : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

LtMatmul::~LtMatmul() = default;

LtMatmul::Plan* LtMatmul::PlanFor(const Call& call) {
  const void* c = call.c != nullptr ? call.c : call.d.data;
  const std::vector<int64_t> key = {call.trans_a,
                                    call.trans_b,
                                    call.m,
                                    call.n,
                                    call.k,
                                    call.lda,
                                    call.ldb,
                                    call.ldd,
                                    static_cast<int64_t>(call.compute),
                                    static_cast<int64_t>(call.a.type),
                                    static_cast<int64_t>(call.b.type),
                                    static_cast<int64_t>(call.d.type),
                                    static_cast<int64_t>(call.bias.type),
                                    call.epilogue,
                                    call.c != nullptr,
                                    call.bias.data != nullptr ? AlignmentOf(call.bias.data) : 0,
                                    call.aux != nullptr ? AlignmentOf(call.aux) : 0,
                                    AlignmentOf(call.a.data),
                                    AlignmentOf(call.b.data),
                                    AlignmentOf(c),
                                    AlignmentOf(call.d.data)};
  std::unique_ptr<Plan>& slot = plans_[key];
  if (slot != nullptr) return slot.get();
  slot = std::make_unique<Plan>();
  Plan& p = *slot;
  const int32_t trans_a = call.trans_a, trans_b = call.trans_b;
  // cuBLASLt's rule for the aux matrix (cublasLt.h, EPILOGUE_AUX_LD): a leading dimension
  // divisible by 8. Where it is not, cuBLASLt is not asked: a library that let it through the
  // heuristic and refused the matmul would stop the run (DROVER_CUBLAS_CHECK).
  bool ok = call.aux == nullptr || call.ldd % 8 == 0;
  ok = ok && Ok(cublasLtMatmulDescCreate(&p.desc, call.compute, CUDA_R_32F)) &&
       SetDesc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, trans_a) &&
       SetDesc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, trans_b) &&
       SetDesc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, call.epilogue);
  // The heuristic reads the bias and aux pointers' alignment; each call sets them again.
  if (ok && call.bias.data != nullptr) {
    ok = SetDesc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias.data) &&
         SetDesc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(call.bias.type));
  }
  if (ok && call.aux != nullptr) {
    ok = SetDesc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux) &&
         SetDesc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{call.ldd}) &&
         SetDesc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                 static_cast<int32_t>(call.d.type));
  }
  const bool ta = call.trans_a == CUBLAS_OP_T, tb = call.trans_b == CUBLAS_OP_T;
  ok = ok &&
       Ok(cublasLtMatrixLayoutCreate(&p.a, call.a.type, ta ? call.k : call.m, ta ? call.m : call.k,
                                     call.lda)) &&
       Ok(cublasLtMatrixLayoutCreate(&p.b, call.b.type, tb ? call.n : call.k, tb ? call.k : call.n,
                                     call.ldb)) &&
       Ok(cublasLtMatrixLayoutCreate(&p.c, call.d.type, call.m, call.n, call.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  ok = ok && Ok(cublasLtMatmulPreferenceCreate(&pref));
  if (ok) {
    const uint64_t workspace = workspace_bytes_;
    // C is D itself when there is none (beta 0): D's alignment serves for both.
    const uint32_t aligns[4] = {static_cast<uint32_t>(AlignmentOf(call.a.data)),
                                static_cast<uint32_t>(AlignmentOf(call.b.data)),
                                static_cast<uint32_t>(AlignmentOf(c)),
                                static_cast<uint32_t>(AlignmentOf(call.d.data))};
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
    std::fprintf(
        stderr, "drover cuda: cuBLASLt has no algorithm for %s m=%d n=%d k=%d ldd=%d%s%s%s%s; %s\n",
        call.what, call.m, call.n, call.k, call.ldd,
        call.a.type == CUDA_R_32F ? "" : " (16-bit inputs)",
        call.d.type == CUDA_R_32F ? "" : " (16-bit output)",
        call.bias.data != nullptr ? " +bias" : "", call.c != nullptr ? " +residual" : "",
        call.fallback);
  }
  return &p;
}

bool LtMatmul::Run(const Call& call, cudaStream_t stream) {
  Plan* p = PlanFor(call);
  if (!p->usable) return false;
  if (call.bias.data != nullptr) {
    DROVER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &call.bias.data, sizeof(call.bias.data)));
  }
  if (call.aux != nullptr) {
    DROVER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux, sizeof(call.aux)));
  }
  const float alpha = 1.0f, beta = call.c != nullptr ? 1.0f : 0.0f;
  const void* c = call.c != nullptr ? call.c : call.d.data;
  DROVER_CUBLAS_CHECK(cublasLtMatmul(lt_, p->desc, &alpha, call.a.data, p->a, call.b.data, p->b,
                                     &beta, c, p->c, call.d.data, p->c, &p->algo, workspace_,
                                     workspace_bytes_, stream));
  return true;
}

// As the cuBLAS path (matmul.cu): D^T (OC, N) = W^T' (OC, C) inp^T (C, N) [+ residual^T],
// with A = weight stored (C, OC), B = inp stored (C, N) and D = out stored (OC, N) with
// leading dimension ldo; the bias is per row of D.
bool LtMatmul::Forward(GemmOutput out, GemmOperand inp, GemmOperand weight, GemmOperand bias,
                       const float* residual, int N, int C, int OC, int ldo,
                       cublasComputeType_t compute, cudaStream_t stream) {
  const uint32_t epilogue =
      bias.data != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  return Run({"the forward GEMM", "it runs through cuBLAS", CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C,
              weight, C, inp, C, residual, out, ldo, epilogue, bias, nullptr, compute},
             stream);
}

// The forward's layout, with D = out and aux = pre, both (OC, N) with leading dimension OC.
bool LtMatmul::GeluForward(GemmOutput out, GemmOutput pre, GemmOperand inp, GemmOperand weight,
                           GemmOperand bias, int N, int C, int OC, cublasComputeType_t compute,
                           cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(pre.type == out.type);
  const uint32_t epilogue =
      bias.data != nullptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  return Run({"the GEMM with GELU in its epilogue", "GELU runs as its own kernel", CUBLAS_OP_T,
              CUBLAS_OP_N, OC, N, C, weight, C, inp, C, nullptr, out, OC, epilogue, bias, pre.data,
              compute},
             stream);
}

// As the cuBLAS path's input gradient (matmul.cu): dinp^T (C, N) = W (C, OC) dout^T (OC, N),
// with A = weight stored (C, OC) and B = dout stored (OC, N) with leading dimension ldo; aux =
// pre stored (C, N), D's layout.
bool LtMatmul::DgeluBackward(GemmOutput dinp, GemmOperand dout, int ldo, GemmOperand weight,
                             GemmOperand pre, int N, int C, int OC, cublasComputeType_t compute,
                             cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(pre.type == dinp.type);
  return Run({"the input gradient GEMM with GELU's backward in its epilogue",
              "GELU's backward runs as its own kernel", CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight,
              C, dout, ldo, nullptr, dinp, C, CUBLASLT_EPILOGUE_DGELU,
              GemmOperand{nullptr, CUDA_R_32F}, pre.data, compute},
             stream);
}

// As the cuBLAS path's weight gradient (matmul.cu): dweight^T (C, OC) = inp^T (C, N) dout
// (N, OC), with A = inp stored (C, N), B = dout stored (OC, N) with leading dimension ldo and
// transposed, so that the bias gradient of B, a sum over k = N for each of D's OC columns, is
// dout's column sum over the rows.
bool LtMatmul::WeightGradient(float* dweight, float* dbias, GemmOperand dout, int ldo,
                              GemmOperand inp, int N, int C, int OC, bool accumulate,
                              cublasComputeType_t compute, cudaStream_t stream) {
  return Run({"the weight gradient GEMM with the bias gradient in its epilogue",
              "the bias gradient runs as its own column sum", CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N,
              inp, C, dout, ldo, accumulate ? dweight : nullptr, GemmOutput{dweight, CUDA_R_32F}, C,
              CUBLASLT_EPILOGUE_BGRADB, GemmOperand{dbias, CUDA_R_32F}, nullptr, compute},
             stream);
}

}  // namespace drover::engine::cuda
