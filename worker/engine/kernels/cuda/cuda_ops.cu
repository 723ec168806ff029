// CudaOps: the kernel table (kernels/ops.h) over the CUDA ops of this directory, on one
// GPU and one stream, and the plugin's entry point (kernels/cuda_backend.h).
//
// Memory: arenas are cudaMalloc'ed once each, at start-up (the engine sizes every arena
// then), zero-filled; nothing is allocated inside a step except the first time a scratch
// buffer (token ids and their buckets, attention's datt, or its row sums and narrowed dout,
// the column sums', the GEMMs' 16-bit operand copies) grows. Token ids arrive in host memory
// (the data loader's): they are copied to a device buffer on the stream, which orders the
// copy after every kernel still reading the previous ids.
//
// Synchronisation: every kernel is enqueued on the one compute stream; the calls that return
// a value to the host (CrossEntropyForward, SumSquares) wait for it. Copies between host and
// device run on a second stream, ordered by events after the compute work enqueued before
// the call (ToHost, FromHost) and before the work enqueued after it (FromHost), so that the
// data-parallel communication thread's staging overlaps the training thread's backward.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "worker/engine/kernels/cuda/column_sum.cuh"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/device_memory.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/scratch.h"
#include "worker/engine/kernels/cuda/token_buckets.h"
#include "worker/engine/kernels/cuda_backend.h"
#include "worker/engine/kernels/ops.h"

namespace drover::engine::cuda {

namespace {

// Which kernels take an attention: the fused ones on mma.sync register tiles
// (attention_mma.cu), the fused ones on wmma tiles (flash_attention.cu), or the GEMMs
// (attention.cu), the first that applies. fp32 runs always take the GEMMs (pedantic fp32).
// DROVER_CUDA_ATTENTION=wmma starts from the wmma kernels and =gemms keeps the GEMMs for
// every run, to compare them (tests/device/speed.sh); =cudnn hands the shapes cuDNN takes to
// its fused attention (cudnn_attention.cu) and the others to the mma kernels, and stops where
// cuDNN cannot be opened or has no engine for a shape it should take; =auto does the same but
// leaves to the mma kernels what cuDNN cannot do (kAuto: a choice, never AttentionFor's
// answer). It is read when the table is made, so forward and backward always agree.
enum class AttentionKernels { kCudnn, kAuto, kMma, kWmma, kGemms };

// DROVER_CUDA_ATTENTION's value (null: unset): the kernels to start from. False, with *error
// naming the value and the choices, for a value it does not name.
bool ParseAttentionChoice(const char* text, AttentionKernels* start, std::string* error) {
  const std::pair<const char*, AttentionKernels> names[] = {{"mma", AttentionKernels::kMma},
                                                            {"wmma", AttentionKernels::kWmma},
                                                            {"gemms", AttentionKernels::kGemms},
                                                            {"cudnn", AttentionKernels::kCudnn},
                                                            {"auto", AttentionKernels::kAuto}};
  *start = AttentionKernels::kMma;
  if (text == nullptr) return true;
  *error = std::string("\"") + text + "\" is not one of";
  for (const auto& [name, kernels] : names) {
    if (std::strcmp(text, name) == 0) {
      *start = kernels;
      return true;
    }
    *error += std::string(kernels == AttentionKernels::kMma ? " " : ", ") + name +
              (kernels == AttentionKernels::kMma ? " (the default)" : "");
  }
  return false;
}

class CudaOpsImpl final : public Ops {
 public:
  // lt may be null: the forward GEMMs then run through cuBLAS only. staging may be null:
  // mixed-precision GEMMs then read their fp32-stored operands as they are (matmul.cu).
  // tiles: the fused attention's (attention_mma.cu).
  CudaOpsImpl(cudaStream_t stream, cudaStream_t copy_stream, cublasHandle_t blas,
              std::unique_ptr<LtMatmul> lt, std::unique_ptr<GemmStaging> staging,
              const MmaAttentionTiles& tiles, AttentionKernels attention,
              std::unique_ptr<CudnnAttention> cudnn)
      : stream_(stream),
        copy_stream_(copy_stream),
        blas_(blas),
        lt_(std::move(lt)),
        staging_(std::move(staging)),
        tiles_(tiles),
        attention_(attention),
        cudnn_(std::move(cudnn)),
        allocator_(stream) {}
  ~CudaOpsImpl() override {
    if (mark_ != nullptr) (void)cudaEventDestroy(mark_);
  }

  const char* name() const override { return "cuda"; }
  cudaStream_t compute_stream() const { return stream_; }
  Allocator* allocator() override { return &allocator_; }
  Allocator* host_allocator() override { return &pinned_; }
  uint64_t device_allocations() const override { return DeviceAllocationCount(); }
  DeviceBytesHeld device_bytes() const override {
    const DeviceMemoryUse use = DeviceMemoryNow();
    return {use.held, use.peak};
  }

  void Fill(float* x, float value, size_t n) override { cuda::Fill(x, value, n, stream_); }
  void Copy(float* dst, const float* src, size_t n) override {
    if (n == 0 || dst == src) return;
    DROVER_CUDA_REQUIRE(dst + n <= src || src + n <= dst);  // no overlap on the device
    DROVER_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  }
  void Add(float* y, const float* x, size_t n) override { cuda::Add(y, x, n, stream_); }
  void Scale(float* x, size_t n, float s) override { cuda::Scale(x, n, s, stream_); }
  double SumSquares(const float* x, size_t n) override {
    return cuda::SumSquares(x, n, sum_scratch_.Get(SumSquaresScratch()), stream_);
  }
  void ToHost(float* host, const float* x, size_t n) override {
    if (n == 0) return;
    // On the copy stream, after the compute work enqueued so far and not after what comes
    // later: the communication thread stages a finished gradient bucket while the
    // training thread's backward goes on.
    cudaEvent_t computed = Record(stream_);
    DROVER_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, computed, 0));
    DROVER_CUDA_CHECK(
        cudaMemcpyAsync(host, x, n * sizeof(float), cudaMemcpyDeviceToHost, copy_stream_));
    DROVER_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    DROVER_CUDA_CHECK(cudaEventDestroy(computed));
  }
  void FromHost(float* x, const float* host, size_t n) override {
    if (n == 0) return;
    // After the kernels enqueued so far (they may still read x), and before those enqueued
    // from now on (they must see the new values).
    cudaEvent_t computed = Record(stream_);
    DROVER_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, computed, 0));
    DROVER_CUDA_CHECK(
        cudaMemcpyAsync(x, host, n * sizeof(float), cudaMemcpyHostToDevice, copy_stream_));
    cudaEvent_t copied = Record(copy_stream_);
    DROVER_CUDA_CHECK(cudaStreamWaitEvent(stream_, copied, 0));
    // The caller may free or reuse `host` as soon as this returns.
    DROVER_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    DROVER_CUDA_CHECK(cudaEventDestroy(computed));
    DROVER_CUDA_CHECK(cudaEventDestroy(copied));
  }
  bool IsDeviceMemory(const void* p) const override {
    // Pageable host memory is cudaMemoryTypeUnregistered (CUDA >= 11), not an error.
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error state of this thread
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  }
  void Synchronize() override {
    DROVER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    DROVER_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  }
  void MarkWork() override {
    if (mark_ == nullptr)
      DROVER_CUDA_CHECK(cudaEventCreateWithFlags(&mark_, cudaEventDisableTiming));
    DROVER_CUDA_CHECK(cudaEventRecord(mark_, stream_));
  }
  bool MarkedWorkDone() override {
    if (mark_ == nullptr) return true;
    const cudaError_t state = cudaEventQuery(mark_);
    if (state == cudaErrorNotReady) return false;
    DROVER_CUDA_CHECK(state);
    return true;
  }
  void Round(float* x, size_t n, Precision p) override { RoundCopy(x, x, n, p); }
  void RoundCopy(float* dst, const float* src, size_t n, Precision p) override {
    if (p == Precision::kFp32) return Copy(dst, src, n);
    cuda::Round(dst, src, n, p == Precision::kBf16 ? 1 : 2, stream_);
  }
  // Operand buffers (ops.h) hold bf16 / fp16 themselves in mixed precision, unless
  // DROVER_CUDA_GEMM_INPUTS=fp32 asked for the GEMMs to read fp32 (no staging).
  size_t OperandFloats(size_t n, Precision p) const override { return Narrow(p) ? (n + 1) / 2 : n; }
  // Nothing to do: every op of this table that reads a GEMM's output rounds it as it loads it
  // (the fused attention's tiles, GELU, the cross-entropy, LayerNorm's backward, the GEMMs'
  // 16-bit copies; the GEMM attention takes a rounded copy first), which saves a pass over
  // each of them, the logits among them.
  void NarrowWritten(float*, size_t, Precision) override {}

  void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                      int T, int C, Precision store) override {
    cuda::EncoderForward(out, Tokens(inp, B * T), wte, wpe, B, T, C, store, stream_);
  }
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                       int T, int C) override {
    const int32_t* buckets = Buckets(inp, B * T, &buckets_);
    cuda::EncoderBackward(dwte, dwpe, dout, buckets, buckets_.host.distinct(), B, T, C, stream_);
  }
  void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                             const float* dout, const int32_t* inp, int B, int T, int C) override {
    // Called on the data-parallel communication thread (ops.h): buckets of its own, so
    // that it never overwrites those the training thread's next kernel reads.
    const int32_t* buckets = Buckets(inp, B * T, &window_buckets_);
    cuda::EncoderBackwardWindow(dwindow, lo, hi, wpe_offset, dout, buckets,
                                window_buckets_.host.distinct(), B, T, C, stream_);
  }
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, Precision store) override {
    cuda::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, store, Narrow(store), stream_);
  }
  void LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                         const float* dout, bool dout_operand, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int N, int C,
                         bool accumulate, Precision store) override {
    // A copy only where operand buffers are 16-bit: floats ones would be a second copy of
    // dinp, which the GEMM reads as well.
    DROVER_CUDA_REQUIRE(dinp_copy == nullptr || Narrow(store));
    cuda::LayerNormBackward(dinp, dinp_copy, dweight, dbias, dout, dout_operand && Narrow(store),
                            inp, weight, mean, rstd, N, C, accumulate, store,
                            column_scratch_.Get(LayerNormBackwardScratch(N, C)), stream_);
  }
  void MatmulForward(float* out, bool out_operand, const float* inp, const float* weight,
                     const float* bias, const float* residual, int N, int C, int OC, int ldo,
                     Precision operands) override {
    const bool narrow = Narrow(operands);
    cuda::MatmulForward(blas_, lt_.get(), staging_.get(), out, out_operand && narrow, inp, weight,
                        bias, residual, N, C, OC, ldo, operands, stream_);
  }
  void MatmulBackward(float* dinp, bool dinp_operand, float* dweight, float* dbias,
                      const float* dout, bool dout_operand, const float* inp, const float* weight,
                      int N, int C, int OC, int ldo, bool accumulate, Precision operands) override {
    const bool narrow = Narrow(operands);
    float* scratch = dbias != nullptr ? column_scratch_.Get(ColumnSumScratch(N, OC)) : nullptr;
    cuda::MatmulBackward(blas_, lt_.get(), staging_.get(), dinp, dinp_operand && narrow, dweight,
                         dbias, dout, dout_operand && narrow, inp, weight, N, C, OC, ldo,
                         accumulate, operands, scratch, stream_);
  }
  size_t AttentionStateFloats(int B, int T, int C, int NH, Precision operands) const override {
    if (AttentionFor(B, T, C, NH, operands) != AttentionKernels::kGemms) {
      return FlashAttentionStateFloats(B, T, C, NH);
    }
    return Ops::AttentionStateFloats(B, T, C, NH, operands);
  }
  void AttentionForward(float* out, float* state, const float* qkv, int B, int T, int C, int NH,
                        Precision operands) override {
    const size_t btc = static_cast<size_t>(B) * T * C;
    const AttentionKernels kernels = AttentionFor(B, T, C, NH, operands);
    if (kernels == AttentionKernels::kCudnn) {
      cudnn_->Forward(out, state, qkv, B, T, C, NH, operands, &datt_);
    } else if (kernels == AttentionKernels::kMma) {
      cuda::MmaAttentionForward(out, state, qkv, B, T, C, NH, operands, Narrow(operands), tiles_,
                                stream_);
    } else if (kernels == AttentionKernels::kWmma) {
      cuda::FlashAttentionForward(out, state, qkv, B, T, C, NH, operands, Narrow(operands),
                                  stream_);
    } else {
      const float* q = RoundedCopy(&rounded_qkv_, qkv, 3 * btc, operands, true);
      // cuBLAS writes floats: into out itself, or a scratch that NarrowCopy then stores.
      float* o = Narrow(operands) ? gemm_out_.Get(btc) : out;
      cuda::AttentionForward(blas_, o, state, q, B, T, C, NH, operands, stream_);
      StoreOperand(out, o, btc, operands);
    }
  }
  void AttentionBackward(float* dqkv, const float* dout, bool dout_operand, const float* out,
                         const float* state, const float* qkv, int B, int T, int C, int NH,
                         Precision operands) override {
    const bool dout_narrow = dout_operand && Narrow(operands);
    const AttentionKernels kernels = AttentionFor(B, T, C, NH, operands);
    if (kernels == AttentionKernels::kCudnn) {
      cudnn_->Backward(dqkv, dout, dout_narrow, out, state, qkv, B, T, C, NH, operands, &datt_);
    } else if (kernels == AttentionKernels::kMma) {
      float* scratch = datt_.Get(cuda::MmaAttentionScratchFloats(B, T, C, NH));
      cuda::MmaAttentionBackward(dqkv, scratch, dout, dout_narrow, out, state, qkv, B, T, C, NH,
                                 operands, Narrow(operands), tiles_, stream_);
    } else if (kernels == AttentionKernels::kWmma) {
      float* dot = datt_.Get(static_cast<size_t>(B) * NH * T);
      cuda::FlashAttentionBackward(dqkv, dot, dout, dout_narrow, out, state, qkv, B, T, C, NH,
                                   operands, Narrow(operands), stream_);
    } else {
      float* datt = datt_.Get(static_cast<size_t>(B) * NH * T * T);
      const size_t btc = static_cast<size_t>(B) * T * C;
      const float* q = RoundedCopy(&rounded_qkv_, qkv, 3 * btc, operands, true);
      const float* dy = RoundedCopy(&rounded_dout_, dout, btc, operands, dout_operand);
      float* d = Narrow(operands) ? gemm_out_.Get(3 * btc) : dqkv;
      cuda::AttentionBackward(blas_, d, datt, dy, state, q, B, T, C, NH, operands, stream_);
      StoreOperand(dqkv, d, 3 * btc, operands);
    }
  }
  void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH) override {
    cuda::AttentionDecode(out, qkv, from, rows, C, NH, stream_);
  }
  void GeluForward(float* out, const float* inp, size_t N, Precision store) override {
    cuda::GeluForward(out, inp, N, store, Narrow(store), stream_);
  }
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N,
                    Precision store) override {
    cuda::GeluBackward(dinp, inp, dout, N, store, Narrow(store), stream_);
  }
  void MatmulGeluForward(float* out, float* pre, const float* inp, const float* weight,
                         const float* bias, int N, int C, int OC, Precision operands) override {
    cuda::MatmulGeluForward(blas_, lt_.get(), staging_.get(), out, pre, inp, weight, bias, N, C, OC,
                            operands, stream_);
  }
  void GeluMatmulBackward(float* dpre, float* dweight, float* dbias, const float* dout,
                          bool dout_operand, const float* inp, const float* weight,
                          const float* pre, int N, int C, int OC, bool accumulate,
                          Precision operands) override {
    float* scratch = dbias != nullptr ? column_scratch_.Get(ColumnSumScratch(N, OC)) : nullptr;
    cuda::GeluMatmulBackward(blas_, lt_.get(), staging_.get(), dpre, dweight, dbias, dout,
                             dout_operand && Narrow(operands), inp, weight, pre, N, C, OC,
                             accumulate, operands, scratch, stream_);
  }
  float CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int N, int V, int Vp, Precision operands) override {
    double* mean = mean_.Get(1);
    cuda::CrossEntropyForward(losses, lse, mean, logits, Tokens(targets, N), N, V, Vp, operands,
                              Narrow(operands), stream_);
    return MeanOnHost(mean);
  }
  void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            Precision store) override {
    cuda::CrossEntropyBackward(dlogits, logits, lse, Tokens(targets, N), dloss, N, V, Vp, store,
                               Narrow(store), stream_);
  }
  float CrossEntropyForwardBackward(float* dlogits, float* losses, float* lse, const float* logits,
                                    const int32_t* targets, float dloss, int N, int V, int Vp,
                                    Precision operands) override {
    if (!cuda::CrossEntropyFusedApplies(dlogits, logits, Vp, Narrow(operands))) {
      return Ops::CrossEntropyForwardBackward(dlogits, losses, lse, logits, targets, dloss, N, V,
                                              Vp, operands);
    }
    double* mean = mean_.Get(1);
    cuda::CrossEntropyForwardBackward(dlogits, losses, lse, mean, logits, Tokens(targets, N), dloss,
                                      N, V, Vp, operands, Narrow(operands), stream_);
    return MeanOnHost(mean);
  }
  void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                               const int32_t* targets, int N, int V, int Vp,
                               Precision operands) override {
    cuda::CrossEntropyPartForward(lse, target_logits, logits, Tokens(targets, N), N, V, Vp,
                                  operands, Narrow(operands), stream_);
  }
  float CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                            const float* target_logits, int parts, int N) override {
    double* mean = mean_.Get(1);
    cuda::CrossEntropyCombine(losses, lse, mean, lse_parts, target_logits, parts, N, stream_);
    return MeanOnHost(mean);
  }

  void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                   float weight_decay, const AdamWConfig& config, int64_t t) override {
    DROVER_CUDA_REQUIRE(t >= 1);
    // As the CPU path: bias corrections in double, then float.
    const float c1 = static_cast<float>(1.0 - std::pow(double{config.beta1}, double(t)));
    const float c2 = static_cast<float>(1.0 - std::pow(double{config.beta2}, double(t)));
    cuda::AdamWUpdate(params, grads, m, v, n, lr, weight_decay, config.beta1, config.beta2,
                      config.eps, c1, c2, stream_);
  }
  void AdamWUpdateSegments(float* params, const float* grads, float* m, float* v,
                           const AdamWSegment* segments, size_t count, float lr,
                           const AdamWConfig& config, int64_t t) override {
    DROVER_CUDA_REQUIRE(t >= 1);
    const float c1 = static_cast<float>(1.0 - std::pow(double{config.beta1}, double(t)));
    const float c2 = static_cast<float>(1.0 - std::pow(double{config.beta2}, double(t)));
    const AdamWChunk* chunks = AdamWChunks(segments, count);
    cuda::AdamWUpdateChunks(params, grads, m, v, chunks, adamw_chunks_.count, lr, config.beta1,
                            config.beta2, config.eps, c1, c2, stream_);
  }

 private:
  // The token ids grouped on the host and their device copy (token_buckets.h).
  struct DeviceBuckets {
    TokenBuckets host;
    Scratch<int32_t> device;
  };

  // The chunk table of `segments` on the device, made again only when they change (an
  // optimizer passes the same table every step).
  const AdamWChunk* AdamWChunks(const AdamWSegment* segments, size_t count) {
    const bool same = adamw_chunks_.segments.size() == count &&
                      std::equal(segments, segments + count, adamw_chunks_.segments.begin(),
                                 [](const AdamWSegment& a, const AdamWSegment& b) {
                                   return a.offset == b.offset && a.numel == b.numel &&
                                          a.weight_decay == b.weight_decay;
                                 });
    if (!same) {
      adamw_chunks_.segments.assign(segments, segments + count);
      const std::vector<AdamWChunk> host = AdamWChunksOf(segments, count);
      adamw_chunks_.count = host.size();
      AdamWChunk* device = adamw_chunks_.device.Get(host.size());
      // Pageable source: the copy has read it by the time the call returns.
      DROVER_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(AdamWChunk),
                                        cudaMemcpyHostToDevice, stream_));
    }
    return adamw_chunks_.device.Get(adamw_chunks_.count);
  }

  // Whether operand buffers of a run in p are 16-bit.
  bool Narrow(Precision p) const { return staging_ != nullptr && p != Precision::kFp32; }

  // The kernels that take an attention of this shape: the first that applies, from those
  // DROVER_CUDA_ATTENTION starts at (AttentionKernels).
  AttentionKernels AttentionFor(int B, int T, int C, int NH, Precision operands) const {
    if (attention_ <= AttentionKernels::kAuto && cudnn_ != nullptr && Narrow(operands) &&
        cudnn_->Applies(B, T, C, NH, operands)) {
      return AttentionKernels::kCudnn;
    }
    if (attention_ <= AttentionKernels::kMma && MmaAttentionApplies(C, NH, operands, tiles_)) {
      return AttentionKernels::kMma;
    }
    if (attention_ <= AttentionKernels::kWmma && FlashAttentionApplies(C, NH, operands)) {
      return AttentionKernels::kWmma;
    }
    return AttentionKernels::kGemms;
  }

  // The operand buffer `out` (n elements) from the floats cuBLAS wrote to `written`: a
  // narrowing copy where it is 16-bit (written is then a scratch), else rounding in place
  // (written is out).
  void StoreOperand(float* out, float* written, size_t n, Precision p) {
    if (Narrow(p)) {
      NarrowCopy(out, written, n, p, stream_);
    } else {
      Round(written, n, p);
    }
  }

  // x (n) as floats holding values of p, for the GEMM attention, whose TF32 products read its
  // operands as they are in memory: x itself where p is kFp32, else a copy in `copy`, widened
  // from an operand buffer (`operand`, where those are 16-bit) or rounded (float ones may be
  // unrounded: NarrowWritten).
  const float* RoundedCopy(Scratch<float>* copy, const float* x, size_t n, Precision p,
                           bool operand) {
    if (p == Precision::kFp32) return x;
    float* out = copy->Get(n);
    if (operand && Narrow(p)) {
      WidenCopy(out, x, n, p, stream_);
      return out;
    }
    RoundCopy(out, x, n, p);
    return out;
  }

  // The mean loss a cross-entropy left in *mean (device), once the stream reaches it.
  float MeanOnHost(const double* mean) {
    double host = 0;
    DROVER_CUDA_CHECK(
        cudaMemcpyAsync(&host, mean, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    DROVER_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return static_cast<float>(host);
  }
  // Host token ids (n) on the device, valid for the kernels enqueued next.
  const int32_t* Tokens(const int32_t* host, int n) {
    int32_t* device = tokens_.Get(static_cast<size_t>(n));
    DROVER_CUDA_CHECK(
        cudaMemcpyAsync(device, host, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    return device;
  }
  // The host ids (n) grouped by id, on the device for the kernels enqueued next. The copy
  // from pageable memory has taken the bytes when it returns, so the next Build may reuse
  // the host array at once.
  const int32_t* Buckets(const int32_t* ids, int n, DeviceBuckets* buckets) {
    buckets->host.Build(ids, n);
    const std::vector<int32_t>& packed = buckets->host.packed();
    // Sized for n distinct ids (packed() is at most 3n + 1), so that a batch with more
    // distinct ids than the last never reallocates inside a step.
    int32_t* device = buckets->device.Get(3 * static_cast<size_t>(n) + 1);
    DROVER_CUDA_CHECK(cudaMemcpyAsync(device, packed.data(), packed.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_));
    return device;
  }

  // A fresh event recorded on `stream` now (events are cheap; one per call keeps calls from
  // two threads apart). Destroying it after the waits that use it is safe.
  static cudaEvent_t Record(cudaStream_t stream) {
    cudaEvent_t event = nullptr;
    DROVER_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    DROVER_CUDA_CHECK(cudaEventRecord(event, stream));
    return event;
  }

  cudaStream_t stream_;         // every kernel
  cudaEvent_t mark_ = nullptr;  // MarkWork's, made at its first call
  cudaStream_t copy_stream_;    // ToHost / FromHost, ordered against stream_ by events
  cublasHandle_t blas_;
  std::unique_ptr<LtMatmul> lt_;
  std::unique_ptr<GemmStaging> staging_;
  const MmaAttentionTiles tiles_;
  const AttentionKernels attention_;       // where AttentionFor starts
  std::unique_ptr<CudnnAttention> cudnn_;  // set where attention_ is kCudnn, maybe where kAuto
  DeviceAllocator allocator_;
  PinnedAllocator pinned_;
  Scratch<int32_t> tokens_;
  DeviceBuckets buckets_;
  DeviceBuckets window_buckets_;  // EncoderBackwardWindow's, on the communication thread
  Scratch<float> datt_;
  Scratch<float> rounded_qkv_, rounded_dout_;  // the GEMM attention's (RoundedCopy)
  Scratch<float> gemm_out_;                    // and its fp32 outputs (StoreOperand)
  struct {
    std::vector<AdamWSegment> segments;  // that the device table was made from
    Scratch<AdamWChunk> device;
    size_t count = 0;
  } adamw_chunks_;
  Scratch<float> column_scratch_;  // bias and LayerNorm gradients (column_sum.cuh)
  Scratch<double> sum_scratch_;
  Scratch<double> mean_;
};

void SetError(char* error, size_t len, const char* what, const char* detail) {
  std::snprintf(error, len, "%s: %s", what, detail);
}

Mutex g_tables_mu;
std::vector<const CudaOpsImpl*> g_tables GUARDED_BY(g_tables_mu);  // every table, until exit

}  // namespace

cudaStream_t ComputeStreamOf(const Ops* ops) {
  MutexLock lock(&g_tables_mu);
  for (const CudaOpsImpl* table : g_tables) {
    if (table == ops) return table->compute_stream();
  }
  return nullptr;
}

}  // namespace drover::engine::cuda

extern "C" __attribute__((visibility("default"))) int drover_create_cuda_ops(
    int abi, drover::engine::Ops** ops, char* error, size_t error_len) {
  using drover::engine::cuda::SetError;
  if (abi != drover::engine::kCudaOpsAbi) {
    std::snprintf(error, error_len,
                  "the CUDA backend was built for kernel table ABI %d, this program has %d "
                  "(rebuild them together)",
                  drover::engine::kCudaOpsAbi, abi);
    return -1;
  }
  // The fused attention's tiles (ops_cuda.h: MmaAttentionTiles), for trying another shape or
  // occupancy on a GPU without a rebuild (tests/device/speed.sh takes the fastest that
  // bench_attention_tiles measured); a malformed value stops the table, naming it, before any GPU
  // is asked for.
  drover::engine::cuda::MmaAttentionTiles tiles;
  if (const char* text = std::getenv("DROVER_CUDA_ATTENTION_TILES"); text != nullptr) {
    std::string why;
    if (!drover::engine::cuda::ParseMmaAttentionTiles(text, &tiles, &why)) {
      SetError(error, error_len, "DROVER_CUDA_ATTENTION_TILES", why.c_str());
      return -1;
    }
    std::fprintf(stderr, "drover cuda: fused attention tiles %s (DROVER_CUDA_ATTENTION_TILES)\n",
                 drover::engine::cuda::MmaAttentionTilesName(tiles).c_str());
  }
  drover::engine::cuda::AttentionKernels attention;
  if (std::string why; !drover::engine::cuda::ParseAttentionChoice(
          std::getenv("DROVER_CUDA_ATTENTION"), &attention, &why)) {
    SetError(error, error_len, "DROVER_CUDA_ATTENTION", why.c_str());
    return -1;
  }
  // From here on a failure of the GPU itself (IsDeviceFault) returns kCreateDeviceFault.
  auto failed = [](cudaError_t err) {
    return drover::engine::cuda::IsDeviceFault(err) ? drover::engine::kCreateDeviceFault : -1;
  };
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    SetError(error, error_len, "no usable GPU", drover::engine::cuda::NoUsableGpuWhy(err).c_str());
    return err != cudaSuccess ? failed(err) : drover::engine::kCreateDeviceFault;
  }
  if ((err = cudaSetDevice(0)) != cudaSuccess) {
    SetError(error, error_len, "cudaSetDevice(0)", cudaGetErrorString(err));
    return failed(err);
  }
  cudaStream_t stream = nullptr, copy_stream = nullptr;
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (err = cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking)) != cudaSuccess) {
    SetError(error, error_len, "cudaStreamCreate", cudaGetErrorString(err));
    return failed(err);
  }
  if (std::string why;
      (err = drover::engine::cuda::KernelsRunOnDevice(stream, &why)) != cudaSuccess) {
    SetError(error, error_len, "unusable GPU", why.c_str());
    return failed(err);
  }
  std::unique_ptr<drover::engine::cuda::CudnnAttention> cudnn;
  if (attention <= drover::engine::cuda::AttentionKernels::kAuto) {
    const bool required = attention == drover::engine::cuda::AttentionKernels::kCudnn;
    std::string why;
    cudnn = drover::engine::cuda::CudnnAttention::Open(stream, required, &why);
    if (cudnn == nullptr && required) {
      SetError(error, error_len, "DROVER_CUDA_ATTENTION=cudnn", why.c_str());
      return -1;
    }
    if (cudnn == nullptr) {
      std::fprintf(stderr, "drover cuda: attention on the table's own kernels: %s\n", why.c_str());
    }
  }
  cublasHandle_t blas = nullptr;
  cublasStatus_t st = cublasCreate(&blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(blas, stream);
  // Each GEMM names its compute type (GemmComputeType): pedantic fp32 for fp32 runs, tensor
  // cores for mixed precision. The handle's default math mode lets those types apply.
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH);
  if (st != CUBLAS_STATUS_SUCCESS) {
    SetError(error, error_len, "cuBLAS", cublasGetStatusString(st));
    return -1;
  }
  std::unique_ptr<drover::engine::cuda::LtMatmul> lt;
  const char* matmul = std::getenv("DROVER_CUDA_MATMUL");
  if (matmul == nullptr || std::strcmp(matmul, "cublas") != 0) {
    // cuBLASLt for the forward GEMMs, with the workspace NVIDIA suggests for Hopper.
    constexpr size_t kWorkspaceBytes = size_t{32} << 20;
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    if ((st = cublasLtCreate(&handle)) != CUBLAS_STATUS_SUCCESS) {
      SetError(error, error_len, "cuBLASLt", cublasGetStatusString(st));
      return -1;
    }
    if ((err = drover::engine::cuda::CountedMalloc(&workspace, kWorkspaceBytes)) != cudaSuccess) {
      SetError(error, error_len, "cudaMalloc (cuBLASLt's workspace)", cudaGetErrorString(err));
      return -1;
    }
    lt = std::make_unique<drover::engine::cuda::LtMatmul>(handle, workspace, kWorkspaceBytes);
  }
  // 16-bit copies of the GEMM operands unless DROVER_CUDA_GEMM_INPUTS=fp32 (matmul.cu).
  std::unique_ptr<drover::engine::cuda::GemmStaging> staging;
  const char* inputs = std::getenv("DROVER_CUDA_GEMM_INPUTS");
  if (inputs == nullptr || std::strcmp(inputs, "fp32") != 0) {
    staging = std::make_unique<drover::engine::cuda::GemmStaging>();
  }
  auto* table = new drover::engine::cuda::CudaOpsImpl(stream, copy_stream, blas, std::move(lt),
                                                      std::move(staging), tiles, attention,
                                                      std::move(cudnn));  // until exit
  {
    drover::MutexLock lock(&drover::engine::cuda::g_tables_mu);
    drover::engine::cuda::g_tables.push_back(table);
  }
  *ops = table;
  return 0;
}

// The GPU this process trains on (device 0 of those visible), by PCI bus id, and whether
// this plugin was built with NCCL (parallel/nccl_plugin.h: CudaDeviceFn).
extern "C" __attribute__((visibility("default"))) int drover_cuda_device(int abi, char* bus_id,
                                                                         size_t bus_id_len,
                                                                         int* has_nccl, char* error,
                                                                         size_t error_len) {
  if (abi != drover::engine::kCudaOpsAbi) {
    std::snprintf(error, error_len, "the CUDA backend was built for ABI %d, this program has %d",
                  drover::engine::kCudaOpsAbi, abi);
    return -1;
  }
  const cudaError_t err = cudaDeviceGetPCIBusId(bus_id, static_cast<int>(bus_id_len), 0);
  if (err != cudaSuccess) {
    drover::engine::cuda::SetError(error, error_len, "cudaDeviceGetPCIBusId",
                                   cudaGetErrorString(err));
    return -1;
  }
#ifdef DROVER_HAVE_NCCL
  *has_nccl = 1;
#else
  *has_nccl = 0;
#endif
  return 0;
}
