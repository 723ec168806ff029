// The kernel table: every computation the model and the optimizer do on arena memory, and
// the allocator those arenas come from, behind one interface per backend. The model
// (model/gpt_stage.h), the optimizer and the parallel code call only this, so a second
// backend (CUDA, in the GPU issue) is a second table, and the model does not change.
//
// Shapes and semantics of the layer ops are those of the CPU kernels they wrap
// (kernels/cpu/*.h, one file per op); they are repeated here only where the table adds
// something. Pointers are memory of this backend (host for CpuOps).
//
// Thread-safety: an Ops is stateless apart from its allocator, which is thread-safe; the
// kernels themselves parallelise inside (OpenMP / OpenBLAS for CpuOps), so call each from
// one thread at a time. ToHost, FromHost, IsDeviceMemory and EncoderBackwardWindow may also
// be called from a second thread (the data-parallel communication thread stages buffers and
// adds the embedding rows of other ranks with them) while the training thread runs other
// kernels; a backend with a queue (CUDA's stream) orders them after the work enqueued
// before.
#pragma once

#include <cstddef>
#include <cstdint>

#include "worker/engine/kernels/precision.h"
#include "worker/engine/optim/adamw_config.h"

namespace drover::engine {

// Zero-filled, 64-byte aligned float arrays of one backend.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // n floats, zero-filled. n == 0 returns nullptr. Out of memory is a broken invariant
  // (CHECK): the engine sizes every arena at start-up.
  virtual float* Allocate(size_t n) = 0;
  virtual void Free(float* p) = 0;
};

// An owning handle on one allocation (move-only).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator* allocator, size_t n) : allocator_(allocator), size_(n) {
    data_ = allocator->Allocate(n);
  }
  ~Buffer() { Release(); }
  Buffer(Buffer&& o) noexcept : allocator_(o.allocator_), data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Release();
      allocator_ = o.allocator_;
      data_ = o.data_;
      size_ = o.size_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  void Release() {
    if (data_ != nullptr) allocator_->Free(data_);
    data_ = nullptr;
    size_ = 0;
  }

  Allocator* allocator_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

// Plain host memory (64-byte aligned, zero-filled): CpuOps's arenas and host buffers.
// Thread-safe.
Allocator* HostAllocator();

// When a backend's own work has run out. MarkWork notes every op enqueued so far;
// MarkedWorkDone says whether those have finished. A thread that blocks for something else
// (CommStream::Wait, for the collectives beside backward) tells by them when the rank began
// to stall. CpuOps finishes each op before it returns, so its work is always done (these
// defaults); a queue (CUDA's compute stream) may still be running. One mark at a time: the
// training thread's.
class WorkMarks {
 public:
  virtual ~WorkMarks() = default;
  virtual void MarkWork() {}
  virtual bool MarkedWorkDone() { return true; }
};

class Ops : public WorkMarks {
 public:
  virtual ~Ops() = default;

  virtual const char* name() const = 0;  // "cpu", "cuda"
  virtual Allocator* allocator() = 0;
  Buffer Allocate(size_t n) { return Buffer(allocator(), n); }
  // Host memory for buffers that are kept and copied to and from this backend's memory
  // often (the staged communicator's staging buffer, checkpoint snapshots through
  // kernels/host_floats.h): page-locked for CUDA, so that the
  // copies run at the bus's rate and asynchronously, without a bounce through the driver's
  // own buffers. Allocating it is slow there: allocate once, reuse. Thread-safe. (Pure, not
  // defaulted to HostAllocator(): the CUDA plugin must not reference the engine's symbols.)
  virtual Allocator* host_allocator() = 0;

  // ---- memory ---------------------------------------------------------------------------
  virtual void Fill(float* x, float value, size_t n) = 0;
  virtual void Copy(float* dst, const float* src, size_t n) = 0;
  // y[i] += x[i] (gradient accumulation of reduced shards).
  virtual void Add(float* y, const float* x, size_t n) = 0;
  // x[i] *= s.
  virtual void Scale(float* x, size_t n, float s) = 0;
  // Sum of x[i]^2 in double (gradient norms; sharded runs all-reduce it).
  virtual double SumSquares(const float* x, size_t n) = 0;
  // Host <-> backend memory (identical to Copy for CpuOps).
  virtual void ToHost(float* host, const float* x, size_t n) = 0;
  virtual void FromHost(float* x, const float* host, size_t n) = 0;
  // Whether p points into this backend's own memory rather than the host's: always false
  // for CpuOps, whose memory is the host's. Communicators that move host memory ask it, to
  // stage device buffers and pass host ones straight through (parallel/staged_communicator.h).
  virtual bool IsDeviceMemory(const void* p) const {
    (void)p;
    return false;
  }
  // Device allocations (cudaMalloc) this process's tables of the backend have made so far;
  // 0 on the CPU. Each one synchronises the device, so none should come after a run's first
  // step: the trainer reports a step's count (metrics.jsonl: device_allocations).
  virtual uint64_t device_allocations() const { return 0; }
  // The device memory those tables hold through their allocations now, and the most they
  // have held at once (as PyTorch's memory_allocated and max_memory_allocated count: the
  // CUDA context, cuBLAS's and NCCL's own memory are not in it); zeros on the CPU.
  struct DeviceBytesHeld {
    uint64_t now = 0, peak = 0;
  };
  virtual DeviceBytesHeld device_bytes() const { return {}; }
  // Returns once every op enqueued so far has finished. CpuOps runs each op to completion
  // before it returns, so this returns at once; a backend with a queue (CUDA's streams)
  // waits for it. Training never needs it (the ops that return values wait themselves);
  // profiling does (profiled_ops.h), to charge each op its own time.
  virtual void Synchronize() {}
  // x (n) narrowed in place to precision p, kept as floats (kernels/cpu/round.h): a store
  // of an activation in a mixed-precision run. p == kFp32 leaves x as it is.
  virtual void Round(float* x, size_t n, Precision p) = 0;
  // dst (n) = src rounded to p, as Copy then Round (in one pass where the table can: the
  // mixed-precision compute weights, NarrowedParams, every optimizer step). They do not
  // overlap unless dst == src.
  virtual void RoundCopy(float* dst, const float* src, size_t n, Precision p) {
    Copy(dst, src, n);
    Round(dst, n, p);
  }
  // x (n), just written in fp32 by a GEMM (or summed by a collective), becomes an activation
  // stored in p *as this table's ops read it*: the ops that take it next (attention, GELU,
  // the cross-entropy, LayerNorm's backward) see values of p. CpuOps rounds x in place
  // (Round). A table whose ops round every activation as they load it (CUDA's) may leave x
  // as it is and save a pass over it. So x itself may hold unrounded values afterwards:
  // what is read as a GEMM's residual, sent to another process or read on the host needs
  // Round instead. p == kFp32 leaves x as it is.
  virtual void NarrowWritten(float* x, size_t n, Precision p) { Round(x, n, p); }

  // ---- layers (kernels/cpu/*.h) --------------------------------------------------------
  // `store` is the precision an activation (or activation gradient) output is stored in:
  // each element is rounded to it as it is written (kFp32: as computed), which equals Round
  // after the op without the second pass over memory. Parameter gradients and row
  // statistics (mean, rstd) stay fp32.
  //
  // Operand buffers: activations that pass from one op to the next and that nothing but
  // this table's ops reads, written and read in a format the table chooses for a run of
  // precision p. They are what only GEMMs read (the outputs of LayerNormForward,
  // AttentionForward and GeluForward; the gradients AttentionBackward, GeluBackward and
  // CrossEntropyBackward hand to a GEMM's backward), and GEMM outputs that only one op reads
  // (qkv for attention, the MLP's pre-activation for GELU, the logits for the cross-entropy,
  // GELU's dout), where the GEMM is told so (out_operand, dinp_operand). n elements take
  // OperandFloats(n, p) floats of memory:
  // n where the format is floats holding values of p (CpuOps), (n + 1) / 2 where it is the
  // 16-bit type itself (CUDA's mixed precision: the tensor cores' native input, read and
  // written at half the bytes).
  virtual size_t OperandFloats(size_t n, Precision p) const {
    (void)p;
    return n;
  }
  // out (B, T, C) = wte[inp] + wpe[t]. Under a vocabulary split (tensor parallelism, the
  // model's wte holding some rows), an id of -1 stands for a token whose row another rank
  // holds: its row of out is zero, position included, so the sum over the ranks adds the
  // token's and the position's rows once. The backwards give a -1 no wte row and its
  // position its gradient as any other (wpe is whole on every rank).
  virtual void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe,
                              int B, int T, int C, Precision store) = 0;
  virtual void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                               int B, int T, int C) = 0;
  virtual void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                                     const float* dout, const int32_t* inp, int B, int T,
                                     int C) = 0;
  // out: an operand buffer.
  virtual void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int N, int C,
                                Precision store) = 0;
  // dinp (+)= the input gradient, the sum stored in `store`. dout is floats read as values of
  // `store` (a GEMM's input gradient after NarrowWritten, or a tp group's sum of them), or an
  // operand buffer where dout_operand says so (a GEMM's dinp written as one: half the bytes
  // written and read on a table whose operand buffers are 16-bit). dinp_copy: null, or an
  // operand buffer that receives dinp's sum too, for the GEMM backward that reads it next
  // (dout_operand): a copy the pass makes as it writes dinp, where that GEMM would read dinp
  // and narrow it itself.
  virtual void LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                                 const float* dout, bool dout_operand, const float* inp,
                                 const float* weight, const float* mean, const float* rstd, int N,
                                 int C, bool accumulate, Precision store) = 0;
  // `operands` is the precision the GEMM inputs are stored in (the run's precision.dtype:
  // weights, biases, activations and activation gradients all hold values rounded to it). A backend
  // may form the products in it, on tensor cores with fp32 accumulation (CUDA); since the
  // inputs hold values of that precision, their products are exact in fp32 and equal those
  // CpuOps forms in fp32, which ignores it. Only the summation order differs.
  //
  // bias and residual may be null: a row-parallel GEMM (tensor parallelism) adds them on
  // one rank only, so that the all-reduce that follows adds them once.
  //
  // inp is an operand buffer; weight, residual and dweight are floats. out, dinp and dout
  // are operand buffers where out_operand, dinp_operand and dout_operand say so, else floats
  // (the residual stream and its gradient, and what tensor parallelism sums). An operand
  // out has no residual (CHECKed). Either kind of out or dinp goes to NarrowWritten next
  // (a 16-bit one holds values of `operands` already).
  virtual void MatmulForward(float* out, bool out_operand, const float* inp, const float* weight,
                             const float* bias, const float* residual, int N, int C, int OC,
                             int ldo, Precision operands) = 0;
  virtual void MatmulBackward(float* dinp, bool dinp_operand, float* dweight, float* dbias,
                              const float* dout, bool dout_operand, const float* inp,
                              const float* weight, int N, int C, int OC, int ldo, bool accumulate,
                              Precision operands) = 0;
  // qkv (an operand buffer) and dout hold values of `operands`; the probabilities stay fp32, so the
  // products that read them (att v, and the gradients through the softmax) may use TF32 on CUDA in
  // a mixed-precision run, which keeps 3 more bits of them than a bf16 fused kernel does.
  //
  // out (forward) and dqkv (backward) are stored in `operands` too (as `store` above), in
  // operand buffers.
  //
  // `state` is what forward keeps for backward, AttentionStateFloats(B, T, C, NH, operands)
  // floats that only this table reads: the (B, NH, T, T) probabilities here and for the GEMM
  // version on CUDA, each row's log-sum-exp for CUDA's fused kernels. Backward is given the
  // forward's out too (unchanged since), which those read for the softmax's gradient
  // (D = rowsum(dout * out), as FlashAttention reads its 16-bit out) instead of keeping a
  // copy; the others ignore it. dout is floats read as values of `operands`, or an operand
  // buffer where dout_operand says so (the attention projection's input gradient, written so
  // by its GEMM: half the bytes on a table whose operand buffers are 16-bit).
  virtual size_t AttentionStateFloats(int B, int T, int C, int NH, Precision operands) const {
    (void)C, (void)operands;
    return static_cast<size_t>(B) * NH * T * T;
  }
  virtual void AttentionForward(float* out, float* state, const float* qkv, int B, int T, int C,
                                int NH, Precision operands) = 0;
  virtual void AttentionBackward(float* dqkv, const float* dout, bool dout_operand,
                                 const float* out, const float* state, const float* qkv, int B,
                                 int T, int C, int NH, Precision operands) = 0;
  // A decoder's attention over its key/value cache (GptDecoder), in fp32: qkv (from + rows, 3C)
  // is one sequence's queries, keys and values at positions 0..from+rows-1, and out (rows, C)
  // the attention of the queries at positions from..from+rows-1, each over the keys at its own
  // position and before (causal). The rows of out are AttentionForward's over the whole
  // sequence, from its row `from` on, without the rows before it: a token added to a window
  // costs one query against the cache, not the window again. No state: nothing goes backward.
  virtual void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH) = 0;
  // inp, out (forward), dout and dinp (backward) are operand buffers; dinp may be dout itself
  // (in place, as the model runs it).
  virtual void GeluForward(float* out, const float* inp, size_t N, Precision store) = 0;
  virtual void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N,
                            Precision store) = 0;
  // The MLP's GELU with the GEMM on each side of it, one op each way so that a table may fold
  // GELU into the GEMM (CUDA: cuBLASLt's epilogues), saving a pass over the (N, 4C)
  // activation each way. Not a forward/backward pair: the forward is the first GEMM then
  // GELU, the backward goes back through the second GEMM then GELU, which is where each
  // GEMM's output meets the GELU.
  //
  // pre (N, OC) = inp (N, C) weight^T + [bias], out (N, OC) = gelu(pre). inp, pre and out
  // are operand buffers; pre is what GeluMatmulBackward reads. The default is MatmulForward,
  // NarrowWritten and GeluForward, so a table without a fused version keeps its numerics. A
  // fused one may take GELU of the fp32 sum rather than of pre as stored: out then differs
  // from the default's by up to a rounding step of `operands`.
  virtual void MatmulGeluForward(float* out, float* pre, const float* inp, const float* weight,
                                 const float* bias, int N, int C, int OC, Precision operands) {
    const size_t n = static_cast<size_t>(N) * OC;
    MatmulForward(pre, true, inp, weight, bias, nullptr, N, C, OC, OC, operands);
    if (operands != Precision::kFp32) NarrowWritten(pre, n, operands);
    GeluForward(out, pre, n, operands);
  }
  // The backward of MatmulForward(y, false, inp, weight, ...) where inp = gelu(pre) (the
  // forward's out), through GELU: dpre (N, C) = (dout (N, OC) weight) * gelu'(pre), dweight
  // (OC, C) (+)= dout^T inp, dbias (OC) (+)= dout's column sums. dout is floats with rows OC
  // apart (the residual stream's gradient), or its operand copy where dout_operand
  // (LayerNormBackward's dinp_copy); inp, pre and dpre are operand buffers. The
  // default is MatmulBackward, NarrowWritten and GeluBackward; a fused table may multiply by
  // gelu'(pre) before rounding the product, one rounding step of `operands` fewer.
  virtual void GeluMatmulBackward(float* dpre, float* dweight, float* dbias, const float* dout,
                                  bool dout_operand, const float* inp, const float* weight,
                                  const float* pre, int N, int C, int OC, bool accumulate,
                                  Precision operands) {
    const size_t n = static_cast<size_t>(N) * C;
    MatmulBackward(dpre, true, dweight, dbias, dout, dout_operand, inp, weight, N, C, OC, OC,
                   accumulate, operands);
    if (operands != Precision::kFp32) NarrowWritten(dpre, n, operands);
    GeluBackward(dpre, pre, dpre, n, operands);
  }
  // Returns the mean loss over the N rows. The logits (an operand buffer) hold values of
  // `operands` as this table reads them.
  virtual float CrossEntropyForward(float* losses, float* lse, const float* logits,
                                    const int32_t* targets, int N, int V, int Vp,
                                    Precision operands) = 0;
  // dlogits (N, Vp; an operand buffer, rows Vp apart) = the gradient of the logits (an
  // operand buffer too), stored in `store`; dlogits may be logits itself (in place, as the
  // model runs it). The padded columns get zeros. A target of -1 (its column is another
  // rank's, under a vocabulary split) subtracts no one-hot.
  virtual void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                                    const int32_t* targets, float dloss, int N, int V, int Vp,
                                    Precision store) = 0;
  // CrossEntropyForward, then CrossEntropyBackward(dlogits, logits, lse, targets, dloss, ...,
  // operands), for a training step whose backward seed is known at its forward: a table may
  // do both in one pass over the logits (CUDA's reads each row once). The same values as the
  // two calls, to the order of the lse's sums. dlogits may be logits (in place: the logits
  // are then gone). Returns the mean loss.
  virtual float CrossEntropyForwardBackward(float* dlogits, float* losses, float* lse,
                                            const float* logits, const int32_t* targets,
                                            float dloss, int N, int V, int Vp, Precision operands) {
    const float loss = CrossEntropyForward(losses, lse, logits, targets, N, V, Vp, operands);
    CrossEntropyBackward(dlogits, logits, lse, targets, dloss, N, V, Vp, operands);
    return loss;
  }

  // The cross-entropy over logits split by vocabulary among ranks (tensor parallelism:
  // each holds columns of the LM head), in two halves around the caller's collectives.
  // Part: over this rank's columns [0, V) of rows Vp apart, lse (N) = their log-sum-exp
  // (-inf when V is 0) and target_logits (N) = logits[n, targets[n]], 0 where the target is
  // -1 (another rank's column). The caller all-gathers lse over the ranks into lse_parts
  // (parts, N) and sums target_logits.
  virtual void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                                       const int32_t* targets, int N, int V, int Vp,
                                       Precision operands) = 0;
  // Combine: lse (N) = the log-sum-exp of the parts' lse_parts, losses (N) = lse -
  // target_logits; returns the mean loss, as CrossEntropyForward. lse is the one that
  // CrossEntropyBackward of every part then takes.
  virtual float CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                                    const float* target_logits, int parts, int N) = 0;

  // ---- optimizer (optim/adamw.h) -------------------------------------------------------
  // One AdamW update of n elements with one weight-decay value; t is the 1-based step.
  virtual void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n,
                           float lr, float weight_decay, const AdamWConfig& config, int64_t t) = 0;
  // The same update of every segment (ascending, disjoint) of the arenas, each with its own
  // weight decay: one pass over all of them where the backend can (CUDA: one launch, rather
  // than one per segment, of which GPT-2's decay groups make a hundred).
  virtual void AdamWUpdateSegments(float* params, const float* grads, float* m, float* v,
                                   const AdamWSegment* segments, size_t count, float lr,
                                   const AdamWConfig& config, int64_t t) {
    for (size_t i = 0; i < count; ++i) {
      const AdamWSegment& s = segments[i];
      AdamWUpdate(params + s.offset, grads + s.offset, m + s.offset, v + s.offset, s.numel, lr,
                  s.weight_decay, config, t);
    }
  }
};

// The CPU table (OpenMP + OpenBLAS), shared by everything in the process.
Ops* CpuOps();

}  // namespace drover::engine
