// The kernel emulator's cuBLAS and cuBLASLt (tests/cuda_emu/README.md): the GEMMs the CUDA
// kernel table calls, validated at the call as the libraries do and computed plainly on the
// stream, with the operands rounded as each compute type's tensor cores read them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cublasLt.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime_api.h"
#include "emu_internal.h"
#include "worker/engine/kernels/cpu/round.h"

namespace {

// Whether the column-major matrix (rows, cols, ld) of element_bytes elements at p lies
// inside one device allocation: a GEMM that reaches past it would read or write memory it
// does not own on a GPU.
bool InOneDeviceAllocation(const void* p, int rows, int cols, int ld, size_t element_bytes) {
  if (rows == 0 || cols == 0) return true;
  return drover_emu::InDeviceMemory(p, (static_cast<size_t>(cols - 1) * ld + rows) * element_bytes);
}

// An operand element as the compute type's tensor cores read it.
float AsRead(float x, cublasComputeType_t compute) {
  switch (compute) {
    case CUBLAS_COMPUTE_32F_FAST_16BF:
      drover::engine::cpu::RoundToBf16(&x, 1);
      return x;
    case CUBLAS_COMPUTE_32F_FAST_16F:
      drover::engine::cpu::RoundToFp16(&x, 1);
      return x;
    case CUBLAS_COMPUTE_32F_FAST_TF32: {  // 10 explicit significand bits, nearest even
      if (!std::isfinite(x)) return x;
      uint32_t u;
      std::memcpy(&u, &x, 4);
      u += 0xFFFu + ((u >> 13) & 1u);
      u &= ~0x1FFFu;
      std::memcpy(&x, &u, 4);
      return x;
    }
    default:
      return x;
  }
}

// A GEMM input matrix of one of the types the table passes: fp32, or 16-bit bf16 / fp16
// (the GEMMs' staged copies), read as floats.
struct Input {
  const void* data;
  cudaDataType_t type;

  size_t ElementBytes() const { return type == CUDA_R_32F ? 4 : 2; }
  float operator[](size_t i) const {
    switch (type) {
      case CUDA_R_16BF:
        return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
      case CUDA_R_16F:
        return __half2float(static_cast<const __half*>(data)[i]);
      default:
        return static_cast<const float*>(data)[i];
    }
  }
};

// A GEMM output matrix: fp32, or 16-bit of the inputs' type (an operand buffer), each element
// rounded to nearest even as it is stored.
struct Output {
  void* data;
  cudaDataType_t type;

  size_t ElementBytes() const { return type == CUDA_R_32F ? 4 : 2; }
  float Get(size_t i) const { return Input{data, type}[i]; }
  void Set(size_t i, float v) const {
    switch (type) {
      case CUDA_R_16BF:
        static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(v);
        return;
      case CUDA_R_16F:
        static_cast<__half*>(data)[i] = __float2half_rn(v);
        return;
      default:
        static_cast<float*>(data)[i] = v;
    }
  }
};

bool Supported(cudaDataType_t type) {
  return type == CUDA_R_32F || type == CUDA_R_16BF || type == CUDA_R_16F;
}

// GELU's tanh approximation and its slope, in double. cuBLASLt's documentation names no
// formula for its GELU epilogues; this is the one PyTorch and llm.c take them to compute
// (kernels/cuda/lt_matmul.cu), written out here apart from drover's kernels.
constexpr double kSqrt2OverPi = 0.7978845608028654;
double GeluOf(double x) {
  return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
}
double GeluSlope(double x) {
  const double th = std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x));
  const double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
}

// What a cuBLASLt epilogue does after the bias: GELU, keeping its input in aux (written),
// or GELU's backward, the result times GELU's slope at aux (read as stored). aux's leading
// dimension is ld.
struct Epilogue {
  enum Kind { kNone, kGelu, kDgelu } kind = kNone;
  Output aux{nullptr, CUDA_R_32F};
  int64_t ld = 0;
};

// op(X)'s `rows` rows of `k` elements (op(X) is X, column-major with leading dimension ld,
// or its transpose), each as the compute type reads it, packed row after row: a GEMM reads
// every element n (or m) times, and rounding it once per read, through a strided column,
// made the GEMMs most of the emulated tests' time.
std::vector<float> PackRows(Input x, int ld, bool transposed, int rows, int k,
                            cublasComputeType_t compute) {
  std::vector<float> packed(static_cast<size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) {
    for (int p = 0; p < k; ++p) {
      const size_t at =
          transposed ? p + static_cast<size_t>(r) * ld : r + static_cast<size_t>(p) * ld;
      packed[static_cast<size_t>(r) * k + p] = AsRead(x[at], compute);
    }
  }
  return packed;
}

// The dot product of k floats, in double (each product is exact there), in four running sums.
double Dot(const float* a, const float* b, int k) {
  double s[4] = {0, 0, 0, 0};
  int p = 0;
  for (; p + 4 <= k; p += 4) {
    for (int q = 0; q < 4; ++q) s[q] += double{a[p + q]} * b[p + q];
  }
  for (; p < k; ++p) s[0] += double{a[p]} * b[p];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// D = alpha op(A) op(B) + beta C, plus bias[i] on row i where there is a bias (bias.data
// set), then the epilogue: each element summed in double and rounded to float (the fp32
// accumulator), then stored once in D's type. beta 0 ignores C, as cuBLAS does (it may hold
// NaN). C may be D: each element is read before it is written.
void Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, Input A,
          int lda, Input B, int ldb, float beta, Input C, int ldc, Input bias, Output D, int ldd,
          cublasComputeType_t compute, const Epilogue& epilogue = {}) {
  const std::vector<float> a = PackRows(A, lda, ta == CUBLAS_OP_T, m, k, compute);  // op(A)
  const std::vector<float> b = PackRows(B, ldb, tb != CUBLAS_OP_T, n, k, compute);  // op(B)^T
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      const double sum =
          Dot(a.data() + static_cast<size_t>(i) * k, b.data() + static_cast<size_t>(j) * k, k);
      const double c = beta == 0.0f ? 0.0 : double{beta} * C[i + static_cast<size_t>(j) * ldc];
      float v = static_cast<float>(alpha * sum + c);
      if (bias.data != nullptr) v += bias[i];
      const size_t at = i + static_cast<size_t>(j) * ldd;
      const size_t aux_at = i + static_cast<size_t>(j) * epilogue.ld;
      switch (epilogue.kind) {
        case Epilogue::kNone:
          D.Set(at, v);
          break;
        case Epilogue::kGelu:
          epilogue.aux.Set(aux_at, v);
          D.Set(at, static_cast<float>(GeluOf(v)));
          break;
        case Epilogue::kDgelu:
          D.Set(at, static_cast<float>(v * GeluSlope(epilogue.aux.Get(aux_at))));
          break;
      }
    }
  }
}

bool Valid(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda, int ldb,
           int ldc) {
  const int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;
  return m >= 0 && n >= 0 && k >= 0 && lda >= std::max(1, rows_a) && ldb >= std::max(1, rows_b) &&
         ldc >= std::max(1, m);
}

}  // namespace

struct cublasContext {
  cudaStream_t stream = nullptr;  // cublasSetStream's: where its GEMMs are enqueued
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
                                         : "CUBLAS_STATUS_INVALID_VALUE (emulated)";
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb,
                            int m, int n, int k, const void* alpha, const void* A,
                            cudaDataType_t a_type, int lda, const void* B, cudaDataType_t b_type,
                            int ldb, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  // The table's combinations: fp32 inputs, or 16-bit ones of one type (with fp32 compute,
  // as cuBLAS requires of them); an fp32 output, or one of the 16-bit inputs' type.
  const bool narrow = a_type != CUDA_R_32F;
  if (!Supported(a_type) || b_type != a_type || (c_type != CUDA_R_32F && c_type != a_type) ||
      (narrow && compute != CUBLAS_COMPUTE_32F)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (!Valid(ta, tb, m, n, k, lda, ldb, ldc)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
  const Input a{A, a_type}, b{B, b_type};
  const Output c{C, c_type};
  if (!InOneDeviceAllocation(A, na ? m : k, na ? k : m, lda, a.ElementBytes()) ||
      !InOneDeviceAllocation(B, nb ? k : n, nb ? n : k, ldb, b.ElementBytes()) ||
      !InOneDeviceAllocation(C, m, n, ldc, c.ElementBytes())) {
    drover_emu::Die("a GEMM operand reaches past its device allocation (an illegal address)");
  }
  // alpha and beta are read at the call (host pointer mode); the product on the stream.
  const float alpha_f = *static_cast<const float*>(alpha),
              beta_f = *static_cast<const float*>(beta);
  drover_emu::EnqueueWork(handle->stream, [=] {
    Gemm(ta, tb, m, n, k, alpha_f, a, lda, b, ldb, beta_f, Input{C, c_type}, ldc,
         Input{nullptr, c_type}, c, ldc, compute);
  });
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* B,
                                          cudaDataType_t b_type, int ldb, long long stride_b,
                                          const void* beta, void* C, cudaDataType_t c_type, int ldc,
                                          long long stride_c, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  if (a_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;  // the strides below are fp32's
  for (int i = 0; i < batch; ++i) {
    const cublasStatus_t st =
        cublasGemmEx(handle, ta, tb, m, n, k, alpha, static_cast<const float*>(A) + i * stride_a,
                     a_type, lda, static_cast<const float*>(B) + i * stride_b, b_type, ldb, beta,
                     static_cast<float*>(C) + i * stride_c, c_type, ldc, compute, algo);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// ---- cuBLASLt ------------------------------------------------------------------------------
struct cublasLtContext {};
struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;  // -1 (D's) is not taken: the table always sets it
  const void* aux = nullptr;              // EPILOGUE_AUX_POINTER: written by GELU, read by DGELU
  int64_t aux_ld = 0;
  int32_t aux_type = -1;  // -1: D's, as cuBLASLt's default
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque {
  uint64_t workspace = 0;
  uint32_t alignment[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's defaults
};

namespace {

// The largest power of two up to 256 that divides p's address.
uint32_t AlignmentOf(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && at % a != 0) a /= 2;
  return a;
}

template <typename T>
cublasStatus_t SetValue(T* field, const void* buf, size_t bytes) {
  if (buf == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

// The epilogues emulated, and what each adds: a bias, an aux matrix.
bool KnownEpilogue(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_BGRADB;
}
// BGRADB: the bias pointer is an output, D's columns long, of D's type (cublasLt.h: "Bias
// gradient vector elements are the same type as the output elements"), holding op(B)'s
// column sums over k.
bool HasBiasGradient(uint32_t e) { return e == CUBLASLT_EPILOGUE_BGRADB; }
bool HasBias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool HasAux(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         e == CUBLASLT_EPILOGUE_DGELU;
}
cudaDataType_t AuxType(const cublasLtMatmulDescOpaque& desc, const cublasLtMatrixLayoutOpaque& d) {
  return desc.aux_type == -1 ? d.type : static_cast<cudaDataType_t>(desc.aux_type);
}

// An aux matrix cuBLASLt takes: set, of D's type (cublasLt.h: "GELU input matrix elements
// type is the same as the type of elements of the output matrix", fp8 aside), its leading
// dimension a multiple of 8 and at least D's rows (EPILOGUE_AUX_LD).
cublasStatus_t CheckAux(const cublasLtMatmulDescOpaque& desc, const cublasLtMatrixLayoutOpaque& d) {
  if (!HasAux(desc.epilogue)) return CUBLAS_STATUS_SUCCESS;
  if (AuxType(desc, d) != d.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (desc.aux == nullptr || desc.aux_ld % 8 != 0 ||
      desc.aux_ld < static_cast<int64_t>(std::max<uint64_t>(1, d.rows))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return CUBLAS_STATUS_SUCCESS;
}

// m, n, k of D = op(A) op(B) from the layouts, or false when they do not fit together.
bool LtShape(const cublasLtMatmulDescOpaque& desc, const cublasLtMatrixLayoutOpaque& a,
             const cublasLtMatrixLayoutOpaque& b, const cublasLtMatrixLayoutOpaque& c,
             const cublasLtMatrixLayoutOpaque& d, int* m, int* n, int* k) {
  // A and B of one type (fp32, or 16-bit with fp32 compute); C and D of one type, fp32 or
  // (16-bit inputs) theirs, with a bias of D's type: the table's combinations.
  if (!Supported(a.type) || b.type != a.type || c.type != d.type ||
      (d.type != CUDA_R_32F && d.type != a.type) || !KnownEpilogue(desc.epilogue) ||
      ((HasBias(desc.epilogue) || HasBiasGradient(desc.epilogue)) && desc.bias_type != d.type) ||
      (a.type != CUDA_R_32F && desc.compute != CUBLAS_COMPUTE_32F)) {
    return false;
  }
  for (const auto* l : {&a, &b, &c, &d}) {
    if (l->ld < static_cast<int64_t>(std::max<uint64_t>(1, l->rows))) return false;
  }
  *m = static_cast<int>(d.rows);
  *n = static_cast<int>(d.cols);
  const uint64_t a_rows = desc.trans_a == CUBLAS_OP_N ? a.rows : a.cols;
  const uint64_t a_cols = desc.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t b_rows = desc.trans_b == CUBLAS_OP_N ? b.rows : b.cols;
  const uint64_t b_cols = desc.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
  *k = static_cast<int>(a_cols);
  return a_rows == d.rows && b_cols == d.cols && b_rows == a_cols && c.rows == d.rows &&
         c.cols == d.cols;
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque{compute};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return SetValue(&desc->trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return SetValue(&desc->trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return SetValue(&desc->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return SetValue(&desc->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return SetValue(&desc->aux, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return SetValue(&desc->aux_ld, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: {
      int32_t type = -1;
      const cublasStatus_t st = SetValue(&type, buf, bytes);
      if (st != CUBLAS_STATUS_SUCCESS) return st;
      if (type != -1 && !Supported(static_cast<cudaDataType_t>(type))) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
      }
      desc->aux_type = type;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      int32_t type = -1;
      const cublasStatus_t st = SetValue(&type, buf, bytes);
      if (st != CUBLAS_STATUS_SUCCESS) return st;
      if (!Supported(static_cast<cudaDataType_t>(type))) return CUBLAS_STATUS_NOT_SUPPORTED;
      desc->bias_type = static_cast<cudaDataType_t>(type);
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return SetValue(&pref->workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return SetValue(&pref->alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf,
                      bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
// One "algorithm" for any valid problem: it records the alignments it was chosen for (A, B,
// C, D from the preference; the bias and aux pointers' as set on the descriptor then, up to
// 16).
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (requested <= 0) return CUBLAS_STATUS_INVALID_VALUE;
  int m, n, k;
  if (!LtShape(*desc, *a, *b, *c, *d, &m, &n, &k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const cublasStatus_t aux = CheckAux(*desc, *d);
  if (aux != CUBLAS_STATUS_SUCCESS) return aux;
  cublasLtMatmulHeuristicResult_t r{};
  for (int i = 0; i < 4; ++i) r.algo.data[i] = pref->alignment[i];
  r.algo.data[4] = HasBias(desc->epilogue) || HasBiasGradient(desc->epilogue)
                       ? std::min(16u, AlignmentOf(desc->bias))
                       : 1;
  r.algo.data[5] = HasAux(desc->epilogue) ? std::min(16u, AlignmentOf(desc->aux)) : 1;
  r.state = CUBLAS_STATUS_SUCCESS;
  r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t,
                              cudaStream_t stream) {
  int m, n, k;
  if (algo == nullptr || !LtShape(*desc, *a, *b, *c, *d, &m, &n, &k)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const void* pointers[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i) {
    if (AlignmentOf(pointers[i]) < algo->data[i]) {
      drover_emu::Die("cuBLASLt: an operand less aligned than the heuristic's preference");
    }
  }
  const bool bias = HasBias(desc->epilogue), aux = HasAux(desc->epilogue);
  const bool bias_gradient = HasBiasGradient(desc->epilogue);
  if ((bias || bias_gradient) &&
      (desc->bias == nullptr || AlignmentOf(desc->bias) < algo->data[4])) {
    drover_emu::Die("cuBLASLt: a bias pointer less aligned than at the heuristic");
  }
  const cublasStatus_t aux_status = CheckAux(*desc, *d);
  if (aux_status != CUBLAS_STATUS_SUCCESS) return aux_status;
  if (aux && AlignmentOf(desc->aux) < algo->data[5]) {
    drover_emu::Die("cuBLASLt: an aux pointer less aligned than at the heuristic");
  }
  const float alpha_f = *static_cast<const float*>(alpha),
              beta_f = *static_cast<const float*>(beta);
  const bool na = desc->trans_a == CUBLAS_OP_N, nb = desc->trans_b == CUBLAS_OP_N;
  const int lda = static_cast<int>(a->ld), ldb = static_cast<int>(b->ld);
  const int ldc = static_cast<int>(c->ld), ldd = static_cast<int>(d->ld);
  const Input in_a{A, a->type}, in_b{B, b->type}, in_c{C, c->type}, in_bias{desc->bias, d->type};
  const Output out{D, d->type};
  if (!InOneDeviceAllocation(A, na ? m : k, na ? k : m, lda, in_a.ElementBytes()) ||
      !InOneDeviceAllocation(B, nb ? k : n, nb ? n : k, ldb, in_b.ElementBytes()) ||
      (beta_f != 0.0f && !InOneDeviceAllocation(C, m, n, ldc, in_c.ElementBytes())) ||
      !InOneDeviceAllocation(D, m, n, ldd, out.ElementBytes()) ||
      (bias && !InOneDeviceAllocation(desc->bias, m, 1, m, in_bias.ElementBytes())) ||
      (bias_gradient && !InOneDeviceAllocation(desc->bias, n, 1, n, out.ElementBytes())) ||
      (aux && !InOneDeviceAllocation(desc->aux, m, n, static_cast<int>(desc->aux_ld),
                                     out.ElementBytes()))) {
    drover_emu::Die("a GEMM operand reaches past its device allocation (an illegal address)");
  }
  if (C == D && ldc != ldd) return CUBLAS_STATUS_INVALID_VALUE;  // in place: one layout
  // The descriptor's state is taken now (the caller may change or destroy it); the product
  // runs on the stream.
  const cublasComputeType_t compute = desc->compute;
  const cublasOperation_t ta = na ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t tb = nb ? CUBLAS_OP_N : CUBLAS_OP_T;
  const Input epilogue_bias{bias ? desc->bias : nullptr, d->type};
  Epilogue epilogue;
  if (aux) {
    epilogue.kind = desc->epilogue == CUBLASLT_EPILOGUE_DGELU ? Epilogue::kDgelu : Epilogue::kGelu;
    // Written by GELU, only read by DGELU: the pointer's constness is the caller's.
    epilogue.aux = Output{const_cast<void*>(desc->aux), d->type};
    epilogue.ld = desc->aux_ld;
  }
  // BGRADB's output: op(B)'s column j summed over k, in double, stored once in D's type. B's
  // elements as stored (the tensor cores' inputs: 16-bit, or fp32 read as the compute type
  // reads it).
  const Output bias_gradient_out{bias_gradient ? const_cast<void*>(desc->bias) : nullptr, d->type};
  drover_emu::EnqueueWork(stream, [=] {
    Gemm(ta, tb, m, n, k, alpha_f, in_a, lda, in_b, ldb, beta_f, in_c, ldc, epilogue_bias, out, ldd,
         compute, epilogue);
    if (bias_gradient_out.data == nullptr) return;
    for (int j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int i = 0; i < k; ++i) {
        const size_t at =
            tb == CUBLAS_OP_N ? static_cast<size_t>(j) * ldb + i : static_cast<size_t>(i) * ldb + j;
        sum += AsRead(in_b[at], compute);
      }
      bias_gradient_out.Set(j, static_cast<float>(sum));
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
