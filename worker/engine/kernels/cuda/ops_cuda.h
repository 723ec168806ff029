// The CUDA kernel table's launchers, one group per op file (kernels first in each .cu,
// then the launcher that checks its preconditions and launches on `stream`). Shapes and
// semantics are the CPU kernels' (kernels/cpu/*.h); every pointer is device memory except
// where a comment says host. Results agree with the CPU fp32 reference to float rounding
// (summation order differs); every reduction is deterministic (no atomics), so one run
// repeats bit for bit.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/engine/kernels/cuda/scratch.h"
#include "worker/engine/kernels/precision.h"
#include "worker/engine/optim/adamw_config.h"

namespace drover::engine {
class Ops;
}

namespace drover::engine::cuda {

// ---- cuda_ops.cu -----------------------------------------------------------------------
// The compute stream of `ops` when it is a table this plugin created, else null.
cudaStream_t ComputeStreamOf(const Ops* ops);

// ---- device_check.cu -------------------------------------------------------------------
// Whether this build's kernels run on the current device: a trivial kernel launched on
// `stream` and waited for. cudaSuccess when they do; otherwise the error, with *why naming
// the build's architectures, the device's compute capability and the cmake setting to
// rebuild with (or, for a GPU that failed, IsDeviceFault, the error alone).
cudaError_t KernelsRunOnDevice(cudaStream_t stream, std::string* why);
// Why the runtime found no usable GPU, `err` being cudaGetDeviceCount's error (cudaSuccess:
// it counted none), in words that say what to change: no driver installed, a driver older
// than this build's runtime (both versions named), the toolkit's stub library loaded, a
// kernel module and driver library of different versions, no device listed.
std::string NoUsableGpuWhy(cudaError_t err);

// ---- elementwise.cu --------------------------------------------------------------------
void Fill(float* x, float value, size_t n, cudaStream_t stream);
void Add(float* y, const float* x, size_t n, cudaStream_t stream);
void Scale(float* x, size_t n, float s, cudaStream_t stream);
// out (n) = x rounded, as floats; out may be x (in place), else they do not overlap.
// precision: 1 bf16, 2 fp16 (round to nearest even, as a store would; fp16 overflows to inf).
void Round(float* out, const float* x, size_t n, int precision, cudaStream_t stream);
// out (n, 2 bytes each) = x narrowed to bf16 or fp16 (p, not kFp32), round to nearest even:
// a GEMM operand's 16-bit copy (matmul.cu).
void NarrowCopy(void* out, const float* x, size_t n, Precision p, cudaStream_t stream);
// out (n floats) = x (n bf16 or fp16 values, p), exactly: an operand buffer as floats.
void WidenCopy(float* out, const void* x, size_t n, Precision p, cudaStream_t stream);
// Sum of x^2 in double; `scratch` holds at least SumSquaresScratch() doubles. Synchronous.
size_t SumSquaresScratch();
double SumSquares(const float* x, size_t n, double* scratch, cudaStream_t stream);

// ---- encoder.cu ------------------------------------------------------------------------
// Outputs named `store` (ops.h) are rounded to it as they are written.
void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, Precision store, cudaStream_t stream);
// buckets: the batch's ids grouped on the host (token_buckets.h: TokenBuckets::packed(),
// copied to the device), with `distinct` ids.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* buckets,
                     int distinct, int B, int T, int C, cudaStream_t stream);
void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                           const float* dout, const int32_t* buckets, int distinct, int B, int T,
                           int C, cudaStream_t stream);

// ---- layernorm.cu ----------------------------------------------------------------------
// narrow_out: out is a 16-bit operand buffer (ops.h: Ops::OperandFloats), else floats. Likewise
// for the other ops' operand-buffer outputs below.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, Precision store, bool narrow_out,
                      cudaStream_t stream);
// scratch: LayerNormBackwardScratch(N, C) floats, the weight and bias gradients' partial sums.
size_t LayerNormBackwardScratch(int N, int C);
// dout_narrow: dout is a 16-bit operand buffer of `store`, else floats read as its values.
// dinp_copy: null, or a 16-bit operand buffer of `store` that receives dinp's sum too.
void LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                       const float* dout, bool dout_narrow, const float* inp, const float* weight,
                       const float* mean, const float* rstd, int N, int C, bool accumulate,
                       Precision store, float* scratch, cudaStream_t stream);

// ---- matmul.cu (cuBLAS; fp32 runs in pedantic fp32, mixed precision on tensor cores) ----
// The compute type of a GEMM whose operands hold values of `operands`, stored as fp32;
// narrow: both are stored narrowed (false where one is kept in fp32, e.g. attention's
// probabilities).
cublasComputeType_t GemmComputeType(Precision operands, bool narrow);

// A GEMM operand as cuBLAS reads it: fp32, or bf16 / fp16 (an operand buffer, or a copy in
// GemmStaging). Its output likewise.
struct GemmOperand {
  const void* data;
  cudaDataType_t type;
};
struct GemmOutput {
  void* data;
  cudaDataType_t type;
};

// Where a mixed-precision run's GEMMs put 16-bit copies of their fp32-stored operands (the
// weights, the residual stream's gradient; the activations come as 16-bit operand buffers),
// so that cuBLAS reads 2-byte bf16 or fp16 matrices (its native tensor-core kernels) rather
// than fp32 ones it narrows as it goes. The copies are exact: the operands hold values of
// the run's precision. One per table, used on the compute stream from the training thread
// only.
struct GemmStaging {
  Scratch<uint16_t> weight, output_grad, bias;
  Scratch<float> output;  // a 16-bit out's floats where cuBLASLt takes no part
};

// ---- lt_matmul.cu (cuBLASLt, for the matmul.cu launchers below) -----------------------
// The GEMMs that take cuBLASLt's epilogues: the forward GEMM with the bias in its epilogue and
// the residual as its C operand (D = out): one pass over out instead of an initialising
// kernel and a GEMM that reads out back; and the MLP's GEMMs with GELU or its backward in the
// epilogue. One per table; called from the training thread only. Plans (descriptors and the
// heuristic's algorithm) are made once per shape, operand type, epilogue and alignment. Each
// call returns false, with nothing enqueued, where cuBLASLt has no algorithm for it (the
// caller then takes its other path); otherwise the work is enqueued on `stream`.
class LtMatmul {
 public:
  // `workspace` (device, `workspace_bytes`) must outlive this.
  LtMatmul(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // out (N, OC; row stride ldo) = inp (N, C) weight^T + [bias] + [residual]; inp and weight
  // of one type. out and bias: fp32, or both 16-bit (then no residual).
  bool Forward(GemmOutput out, GemmOperand inp, GemmOperand weight, GemmOperand bias,
               const float* residual, int N, int C, int OC, int ldo, cublasComputeType_t compute,
               cudaStream_t stream);
  // pre (N, OC) = inp (N, C) weight^T + [bias] and out (N, OC) = gelu of it in fp32, pre and
  // out of one type (16-bit, with bias), rows OC apart (CUBLASLT_EPILOGUE_GELU_AUX_BIAS).
  bool GeluForward(GemmOutput out, GemmOutput pre, GemmOperand inp, GemmOperand weight,
                   GemmOperand bias, int N, int C, int OC, cublasComputeType_t compute,
                   cudaStream_t stream);
  // dinp (N, C) = (dout (N, OC; row stride ldo) weight (OC, C)) * gelu'(pre (N, C)), the
  // product in fp32 (CUBLASLT_EPILOGUE_DGELU); pre of dinp's type.
  bool DgeluBackward(GemmOutput dinp, GemmOperand dout, int ldo, GemmOperand weight,
                     GemmOperand pre, int N, int C, int OC, cublasComputeType_t compute,
                     cudaStream_t stream);
  // dweight (OC, C; fp32) = [dweight +] dout^T (OC, N; dout's rows ldo apart) inp (N, C), and
  // dbias (OC; fp32) = the sum over n of dout(n, oc), written (never added to), in the same
  // pass over dout (CUBLASLT_EPILOGUE_BGRADB: the bias gradient of B, summed over k).
  bool WeightGradient(float* dweight, float* dbias, GemmOperand dout, int ldo, GemmOperand inp,
                      int N, int C, int OC, bool accumulate, cublasComputeType_t compute,
                      cudaStream_t stream);

 private:
  struct Call;
  struct Plan;
  Plan* PlanFor(const Call& call);
  bool Run(const Call& call, cudaStream_t stream);

  cublasLtHandle_t lt_;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<std::vector<int64_t>, std::unique_ptr<Plan>> plans_;
};

// ---- matmul.cu, its launchers ----------------------------------------------------------
// lt may be null (the cuBLAS path only); fp32 runs take cuBLAS always. staging may be null:
// mixed-precision GEMMs then read the fp32-stored operands with the FAST_16BF / FAST_16F
// compute types (GemmComputeType).
// inp is an operand buffer (ops.h): 16-bit where staging applies (a mixed-precision run with
// staging), else floats. out_narrow, dinp_narrow, dout_narrow: that matrix is a 16-bit
// operand buffer (needs staging), else fp32.
void MatmulForward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* out,
                   bool out_narrow, const float* inp, const float* weight, const float* bias,
                   const float* residual, int N, int C, int OC, int ldo, Precision operands,
                   cudaStream_t stream);
// scratch: ColumnSumScratch(N, OC) floats (column_sum.cuh), for the bias gradient.
void MatmulBackward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* dinp,
                    bool dinp_narrow, float* dweight, float* dbias, const float* dout,
                    bool dout_narrow, const float* inp, const float* weight, int N, int C, int OC,
                    int ldo, bool accumulate, Precision operands, float* scratch,
                    cudaStream_t stream);
// Ops::MatmulGeluForward and Ops::GeluMatmulBackward (ops.h), GELU in cuBLASLt's epilogues
// where the operand buffers are 16-bit (a mixed-precision run with staging) and lt is given
// and has an algorithm; else MatmulForward / MatmulBackward, then gelu.cu's kernels.
void MatmulGeluForward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* out,
                       float* pre, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC, Precision operands, cudaStream_t stream);
void GeluMatmulBackward(cublasHandle_t blas, LtMatmul* lt, GemmStaging* staging, float* dpre,
                        float* dweight, float* dbias, const float* dout, bool dout_narrow,
                        const float* inp, const float* weight, const float* pre, int N, int C,
                        int OC, bool accumulate, Precision operands, float* scratch,
                        cudaStream_t stream);

// ---- attention.cu ----------------------------------------------------------------------
void AttentionForward(cublasHandle_t blas, float* out, float* att, const float* qkv, int B, int T,
                      int C, int NH, Precision operands, cudaStream_t stream);
// datt: scratch of B*NH*T*T floats (the softmax's gradients).
void AttentionBackward(cublasHandle_t blas, float* dqkv, float* datt, const float* dout,
                       const float* att, const float* qkv, int B, int T, int C, int NH,
                       Precision operands, cudaStream_t stream);

// ---- attention_decode.cu ---------------------------------------------------------------
// Ops::AttentionDecode (ops.h): fp32, head size C / NH up to 256.
void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH,
                     cudaStream_t stream);

// ---- flash_attention.cu (fused on wmma tiles, for mixed-precision runs) ---------------
// Whether the fused kernels take this attention: bf16 / fp16 operands, head size C / NH of
// 16, 32, 64 or 128, and the shared memory they need.
bool FlashAttentionApplies(int C, int NH, Precision operands);
// What forward keeps for backward, for both fused versions (this one and attention_mma.cu):
// each row's log-sum-exp (B, NH, T). Backward reads the forward's out besides.
size_t FlashAttentionStateFloats(int B, int T, int C, int NH);
// narrow: qkv and out (dqkv) are 16-bit operand buffers, else floats; dout is floats.
void FlashAttentionForward(float* out, float* state, const float* qkv, int B, int T, int C, int NH,
                           Precision operands, bool narrow, cudaStream_t stream);
// dot: scratch of B*NH*T floats (each row's sum of dout * out). out: the forward's (an
// operand buffer).
// dout_narrow: dout is a 16-bit operand buffer, else floats read as values of `operands`.
void FlashAttentionBackward(float* dqkv, float* dot, const float* dout, bool dout_narrow,
                            const float* out, const float* state, const float* qkv, int B, int T,
                            int C, int NH, Precision operands, bool narrow, cudaStream_t stream);

// ---- attention_mma.cu (fused on mma.sync register tiles, for mixed-precision runs) -----
// The fused kernels' tile shape and occupancy at head size 64 (every GPT-2 size's); other
// head sizes always take the defaults. Each choice computes the same attention: the
// backward's only change the launch bounds (bit for bit the same dqkv), the forward's the
// order of the online softmax over the keys (a few ulps of the run's type).
struct MmaAttentionTiles {
  // Query rows a warp x keys a tile; k32x64QShared reads q from shared memory a k step at a
  // time instead of holding the warp's rows in registers.
  // (16 x 128 keeps 64 bytes of its scores in local memory at its 2 blocks an SM, which the
  // build refuses; bench_attention_tiles times it.)
  enum class Forward { k16x64, k32x64, k32x64QShared };
  Forward forward = Forward::k16x64;
  int dq_blocks = 3;   // blocks an SM the dq kernel's launch bounds allow: 2 or 3
  int dkv_blocks = 3;  // likewise the dk dv kernel's
};
// (attention_tiles_option.cu) Reads `text`, comma-separated key=value pairs (any subset, any
// order): forward=16x64 | 32x64 | 32x64s, dq=2 | 3, dkv=2 | 3 (DROVER_CUDA_ATTENTION_TILES,
// cuda_ops.cu). False, with *error saying which pair and what is allowed, when one is malformed;
// *tiles is then unchanged.
bool ParseMmaAttentionTiles(const char* text, MmaAttentionTiles* tiles, std::string* error);
// `tiles` as ParseMmaAttentionTiles reads it.
std::string MmaAttentionTilesName(const MmaAttentionTiles& tiles);
// The same contract as the FlashAttention* functions above (state of
// FlashAttentionStateFloats), with P and dS narrowed to the run's type for their products.
bool MmaAttentionApplies(int C, int NH, Precision operands, const MmaAttentionTiles& tiles);
void MmaAttentionForward(float* out, float* state, const float* qkv, int B, int T, int C, int NH,
                         Precision operands, bool narrow, const MmaAttentionTiles& tiles,
                         cudaStream_t stream);
// The backward's scratch: each row's sum of dout * out, then dout narrowed to the run's type.
size_t MmaAttentionScratchFloats(int B, int T, int C, int NH);
// scratch: MmaAttentionScratchFloats floats, 16-byte aligned.
void MmaAttentionBackward(float* dqkv, float* scratch, const float* dout, bool dout_narrow,
                          const float* out, const float* state, const float* qkv, int B, int T,
                          int C, int NH, Precision operands, bool narrow,
                          const MmaAttentionTiles& tiles, cudaStream_t stream);

// ---- cudnn_attention.cu (cuDNN's fused attention, DROVER_CUDA_ATTENTION=cudnn) ---------
// The same contract as the fused kernels above (the state is each row's log-sum-exp, backward
// reads the forward's out), on 16-bit operand buffers (qkv, out, dqkv). One per kernel table,
// used by the thread that enqueues its kernels, on its stream.
class CudnnAttention {
 public:
  // Opens cuDNN 9 (DROVER_CUDNN_LIBRARY, else libcudnn.so.9 from the library path) with a
  // handle on `stream`; null with *why saying what is missing. required: a shape whose graphs
  // no engine takes stops the process (else Applies says no).
  static std::unique_ptr<CudnnAttention> Open(cudaStream_t stream, bool required, std::string* why);
  ~CudnnAttention();
  // Whether cuDNN takes this attention: mixed precision, a head size that is a multiple of 8 up
  // to 128, T a multiple of 128, and an engine for the shape's graphs, whose plans are made the
  // first time it is asked (where none takes them and cuDNN is required, the process stops,
  // naming cuDNN's reason).
  bool Applies(int B, int T, int C, int NH, Precision operands);
  // For a shape that Applies. scratch: the table's, grown to what cuDNN's workspace (and the
  // backward's fp32 dQ sum, row sums and 16-bit dout) take.
  void Forward(float* out, float* state, const float* qkv, int B, int T, int C, int NH,
               Precision operands, Scratch<float>* scratch);
  // dout_narrow: dout is a 16-bit operand buffer, else floats holding values of `operands`.
  void Backward(float* dqkv, const float* dout, bool dout_narrow, const float* out,
                const float* state, const float* qkv, int B, int T, int C, int NH,
                Precision operands, Scratch<float>* scratch);

 private:
  CudnnAttention() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- gelu.cu ---------------------------------------------------------------------------
void GeluForward(float* out, const float* inp, size_t N, Precision store, bool narrow_out,
                 cudaStream_t stream);
void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N, Precision store,
                  bool narrow_out, cudaStream_t stream);

// ---- crossentropy.cu -------------------------------------------------------------------
// Writes losses (N) and lse (N); the mean is summed in double into *mean_out (device).
void CrossEntropyForward(float* losses, float* lse, double* mean_out, const float* logits,
                         const int32_t* targets, int N, int V, int Vp, Precision operands,
                         bool narrow, cudaStream_t stream);
void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                          const int32_t* targets, float dloss, int N, int V, int Vp,
                          Precision store, bool narrow_out, cudaStream_t stream);
// Both at once (Ops::CrossEntropyForwardBackward), one read of the logits: where
// CrossEntropyFusedApplies (16-bit logits whose row fits in a block's shared memory).
bool CrossEntropyFusedApplies(const float* dlogits, const float* logits, int Vp, bool narrow);
void CrossEntropyForwardBackward(float* dlogits, float* losses, float* lse, double* mean_out,
                                 const float* logits, const int32_t* targets, float dloss, int N,
                                 int V, int Vp, Precision operands, bool narrow,
                                 cudaStream_t stream);
// The halves of a vocabulary-split cross-entropy (ops.h); the combine's mean is summed in
// double into *mean_out (device).
void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                             const int32_t* targets, int N, int V, int Vp, Precision operands,
                             bool narrow, cudaStream_t stream);
void CrossEntropyCombine(float* losses, float* lse, double* mean_out, const float* lse_parts,
                         const float* target_logits, int parts, int N, cudaStream_t stream);

// ---- adamw.cu --------------------------------------------------------------------------
// correction1/2: 1 - beta^t, computed on the host in double as the CPU path does.
void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                 float weight_decay, float beta1, float beta2, float eps, float correction1,
                 float correction2, cudaStream_t stream);
// A block's share of AdamWUpdateChunks: at most kAdamWChunkElements of one segment.
struct AdamWChunk {
  size_t offset;
  unsigned numel;
  float weight_decay;
};
inline constexpr size_t kAdamWChunkElements = size_t{1} << 16;
// The segments (ops.h: Ops::AdamWUpdateSegments) cut into chunks, in order.
std::vector<AdamWChunk> AdamWChunksOf(const AdamWSegment* segments, size_t count);
// Every chunk's update in one launch; chunks (count) in device memory.
void AdamWUpdateChunks(float* params, const float* grads, float* m, float* v,
                       const AdamWChunk* chunks, size_t count, float lr, float beta1, float beta2,
                       float eps, float correction1, float correction2, cudaStream_t stream);

}  // namespace drover::engine::cuda
