// GptStage: the GPT-2 computation of one pipeline stage on one tensor-parallel rank, as
// XForward / XBackward calls on the kernel table (kernels/ops.h). It owns no memory:
// parameters and gradients come from a StageMemory unit by unit, activations from a
// StageActivations the caller owns (one per micro-batch in flight).
//
// Dimension names: B batch, T sequence, C channels, NH heads, V vocabulary, Vp padded
// vocabulary; per tensor-parallel rank Ca = C / tp attention channels in NHa = NH / tp
// heads, C4 = 4C / tp MLP channels, and Vl = Vp / tp rows of wte when the layout splits the
// vocabulary (GptLayout::vocab_split; else Vl = Vp).
//
// One stage of one rank (layers [l0, l1) of the layout; under the interleaved schedule one
// GptStage per model chunk, each over its chunk's layers, the first chunk of the first
// stage embedding and the last chunk of the last stage scoring):
//   first stage:  x = wte[inputs] + wpe              [split vocabulary: all-reduce] (B, T, C)
//   other stages: x = input() (the previous stage's output)                   (B, T, C)
//   each layer:   ln1 = LN(x); qkv = ln1 @ qkvw^T + qkvb                      (B, T, 3Ca)
//                 atty = causal attention(qkv)                                 (B, T, Ca)
//                 res2 = x + atty @ attprojw^T + attprojb        [tp: all-reduce] (B, T, C)
//                 ln2 = LN(res2); fch = gelu(ln2 @ fcw^T + fcb)                (B, T, C4)
//                 x = res2 + fch @ fcprojw^T + fcprojb           [tp: all-reduce] (B, T, C)
//   last stage:   logits = LN(x) @ wte^T; loss = mean cross-entropy         (B, T, Vl)
//                 [split vocabulary: the slices' log-sum-exps all-gathered and combined]
//   other stages: output() = x
// Backward runs the same in reverse; under tensor parallelism the input gradients of the
// column-parallel GEMMs (qkv, fc) are all-reduced before their LayerNorm's backward, and the
// row-parallel GEMMs add bias and residual on tp rank 0 only, so the all-reduce adds them
// once; under a split vocabulary so is the head's input gradient. Every tp rank computes
// the replicated tensors' gradients identically.
//
// Mixed precision (precision != kFp32): every activation and every activation gradient the
// stage stores is narrowed to the precision as it is written (the ops' `store`), the weights
// come narrowed from the memory (NarrowedParams), and the kernels accumulate in fp32. What
// passes from op to op without anything else reading it (LayerNorm, attention and GELU
// outputs, qkv, the MLP's pre-activation, the logits, and the gradients of the fc, qkv and
// head GEMMs' outputs) lives in operand buffers in the table's format (Ops::OperandFloats:
// bf16 / fp16 themselves on CUDA). GEMM outputs are narrowed after the GEMM by
// Ops::NarrowWritten, which a table may leave to the kernels that read them next. The
// residual stream (the embeddings and each block's two sums) is the exception: it stays
// fp32, as under PyTorch's autocast, where the sum of an fp32 stream and a 16-bit branch is
// fp32. Rounding it cost a pass over it after every residual GEMM on CUDA (2.1 ms of a 76 ms
// GPT-2 124M step on an H200) and made each block's small update lose its low bits against
// the stream; its gradient is stored in the precision as the other gradients are.
// LayerNorm statistics, attention probabilities and the per-row losses stay fp32, as fused
// kernels keep them; the weight gradients are fp32 (StageMemory's arenas).
//
// Recomputation (StageActivations' `recompute`): the chunk's first R layers keep only their
// output (the residual stream, which the next layer reads anyway), and their other buffers
// share those of the first kept layer (StageActivations::Slot). Backward runs each one's
// forward again, up to the MLP's projection (whose output it does not read), with the
// parameters it acquires for the layer's backward anyway, just before that backward. The
// same kernels on the same inputs: the training is that of a run that kept them, bit for bit
// where the kernels are deterministic, as both tables' are. Under tensor parallelism the
// attention projection's all-reduce runs again, on every tp rank alike.
//
// Thread-safety: a GptStage is immutable; Forward/Backward run on one thread at a time per
// StageActivations and StageMemory (the kernels parallelise inside).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/model/stage_memory.h"
#include "worker/engine/parallel/communicator.h"

namespace drover::engine {

// The activations of one micro-batch on one stage. Buffers are sized for (B, T) by Ensure
// and allocated zero-filled from the stage's backend (padded logit columns are never
// written, so they stay defined).
class StageActivations {
 public:
  // `precision` and `chunk` are the stage's (GptStage): the precision decides how much
  // attention keeps for backward (Ops::AttentionStateFloats), the chunk which layers (and
  // whether the head's buffers) there are. `recompute`: how many of the chunk's first layers
  // Backward recomputes (clamped to its layer count; negative: all of them).
  StageActivations(const GptLayout* layout, Ops* ops, Precision precision = Precision::kFp32,
                   int chunk = 0, int recompute = 0);
  StageActivations(const StageActivations&) = delete;
  StageActivations& operator=(const StageActivations&) = delete;

  // Lays the buffers out for (B, T), growing the arena when it needs more. CHECKs
  // 1 <= T <= maxT and B >= 1.
  void Ensure(int B, int T);
  int B() const { return B_; }
  int T() const { return T_; }
  // Bytes of the backend's memory these activations hold (after Ensure).
  size_t bytes() const { return arena_.size() * sizeof(float); }

  // Token ids (B, T): the first stage embeds inputs, the last stage scores targets.
  int32_t* inputs() { return inputs_.data(); }
  int32_t* targets() { return targets_.data(); }
  // (B, T, C) from the previous stage, written by the caller before Forward (stages > 0).
  float* input() { return encoded_; }
  // (B, T, C) for the next stage after Forward (all stages but the last).
  const float* output() const;
  // (B, T, C) gradient of output(), written by the caller before Backward (not last stage).
  float* doutput() { return dres_; }
  // (B, T, C) gradient of input() after Backward (stages > 0).
  const float* dinput() const { return dres_; }
  // (B, T, Vl) after a Forward of the last stage, until Backward reuses the buffer: an
  // operand buffer (Ops::OperandFloats), so floats only where the table keeps them so (the
  // CPU's; not CUDA's in mixed precision). Vl = GptLayout::local_vocab(): Vp, or this tp
  // rank's slice of the vocabulary when it is split.
  const float* logits() const { return logits_; }
  // (B, T) floats after a Forward of the last stage that scored targets (kTrain, kEval): each
  // position's own loss, -log p(target | its inputs so far), whose mean the Forward returned.
  const float* losses() const { return losses_; }

 private:
  friend class GptStage;

  // Floats that n elements of an operand buffer take (Ops::OperandFloats), rounded up to 64
  // bytes so that each layer's slice starts aligned.
  size_t OperandStride(size_t n) const;
  // The slice of the per-layer buffers (all but residual3_) that the chunk's layer i uses:
  // each kept layer (i >= R) its own, i - R, and the recomputed ones (i < R) slice 0 too,
  // that of the first kept layer. They never need it at the same time: forward runs the
  // recomputed layers, whose buffers nothing reads later, before layer R fills the slice;
  // backward recomputes them after layer R's backward has read it for the last time. So
  // recomputing R layers saves R layers' buffers (R - 1 when all are recomputed).
  size_t Slot(size_t i) const {
    const size_t r = static_cast<size_t>(recomputed_);
    return i < r ? 0 : i - r;
  }

  const GptLayout* layout_;
  Ops* ops_;
  const Precision precision_;
  const int chunk_;
  const int recomputed_;  // R: the chunk's first R layers are recomputed
  Buffer arena_;
  int B_ = 0, T_ = 0;
  size_t att_floats_ = 0;  // per layer: attention's state (att_)
  // Per-layer strides of the operand buffers ln1_ and ln2_ (B, T, C), atty_ (B, T, Ca),
  // qkv_ (B, T, 3Ca), and fch_ and fch_gelu_ (B, T, C4).
  size_t op_btc_ = 0, op_btca_ = 0, op_qkv_ = 0, op_btc4_ = 0;
  bool backward_ready_ = false;  // a training Forward of the last stage came right before
  // Set where that Forward knew Backward's grad_scale and left dlogits in logits_ already.
  std::optional<float> seeded_;
  std::vector<int32_t> inputs_, targets_;
  // Under a vocabulary split: inputs_ and targets_ as rows of this rank's wte slice, -1 for
  // the tokens another tp rank holds (ops.h); what the embedding and the loss read.
  std::vector<int32_t> local_inputs_, local_targets_;
  // Per-layer buffers hold one slice per kept local layer, at least one when there are
  // layers (Slot); residual3_ holds every layer's output, slice i for layer l0 + i.
  float *encoded_ = nullptr, *ln1_ = nullptr, *ln1_mean_ = nullptr, *ln1_rstd_ = nullptr,
        *qkv_ = nullptr, *atty_ = nullptr, *att_ = nullptr, *residual2_ = nullptr, *ln2_ = nullptr,
        *ln2_mean_ = nullptr, *ln2_rstd_ = nullptr, *fch_ = nullptr, *fch_gelu_ = nullptr,
        *residual3_ = nullptr;
  float *lnf_ = nullptr, *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *logits_ = nullptr,
        *losses_ = nullptr, *lse_ = nullptr;
  // Under a vocabulary split: every tp rank's log-sum-exps (tp, B*T), this rank's at its
  // index, and the targets' logits (B*T), summed over the ranks.
  float *lse_parts_ = nullptr, *target_logits_ = nullptr;
  // Backward scratch: the residual stream's gradient and working buffers. Operand buffers
  // (ops.h): ln1_, qkv_, atty_, ln2_, fch_, fch_gelu_, lnf_, logits_ (the dlogits after
  // Backward, or after a Forward given its grad_scale), dqkv_ and dfch_, and dbtc_ where it
  // is a LayerNorm's output gradient that no tp group sums; the rest are floats.
  float *dres_ = nullptr, *dbtc_ = nullptr, *dqkv_ = nullptr, *dfch_ = nullptr;
  // dres_'s 16-bit copy (an operand buffer; null where operand buffers are floats), and
  // whether it holds dres_'s current value (the last LayerNorm backward wrote both).
  float* dres_copy_ = nullptr;
  bool dres_copied_ = false;
};

class GptStage {
 public:
  enum class Pass {
    kTrain,   // targets scored; Backward follows (the head's parameters stay acquired)
    kEval,    // targets scored; no Backward
    kLogits,  // no targets (sampling)
  };

  // `tp` is the tensor-parallel group when layout.tp_size() > 1 (CHECKed), else null. Not
  // owned; all must outlive the stage. `chunk` is the layout's model chunk it runs
  // (GptLayout::chunks()); its activations must be laid out for that chunk (CHECKed).
  GptStage(const GptLayout* layout, Ops* ops, parallel::Communicator* tp,
           Precision precision = Precision::kFp32, int chunk = 0);

  // Runs the stage on `a` (inputs() / input() filled by the caller; targets() too on the
  // last stage unless kLogits). Returns the mean loss on the last stage (kTrain, kEval),
  // else 0. Token ids out of range are a broken invariant (CHECK): validate data at its
  // source. Errors come from the memory or the tp group only.
  //
  // kTrain with `grad_scale`, the value the Backward of `a` will be given (known at the
  // forward in a training step): the last stage takes the loss's gradient in the same pass
  // over the logits as the loss (Ops::CrossEntropyForwardBackward; one read of the logits
  // fewer on CUDA, where they are GPT-2's largest activation), and Backward CHECKs it gets
  // the same value. Without it, Backward takes that gradient.
  StatusOr<float> Forward(StageActivations& a, StageMemory& mem, Pass pass,
                          std::optional<float> grad_scale = std::nullopt);

  // Adds d(grad_scale * loss)/d(params) into the memory's gradients (see StageMemory for
  // accumulate), and leaves dinput() on stages > 0. Needs a kTrain Forward of `a` before
  // (CHECKed on the last stage) and, on other stages, doutput() filled.
  Status Backward(StageActivations& a, StageMemory& mem, float grad_scale);

  const GptLayout& layout() const { return *layout_; }
  Ops* ops() const { return ops_; }
  Precision precision() const { return precision_; }

 private:
  // x (n), a GEMM's output (or a tp all-reduce's sum) that only the table's ops read next:
  // stored in the run's precision as they read it (Ops::NarrowWritten), a pass over x saved
  // on tables that round as they load.
  void Written(float* x, size_t n) const {
    if (precision_ != Precision::kFp32) ops_->NarrowWritten(x, n, precision_);
  }
  // out (N, OC) = [residual +] inp (N, IC) @ w^T [+ bias], summed over the tp group.
  Status RowParallelForward(float* out, const float* inp, const float* w, const float* bias,
                            const float* residual, int N, int IC, int OC);
  // The ids the embedding read in the last Forward: rows of this rank's wte slice under a
  // vocabulary split (StageActivations::local_inputs_), else the inputs.
  const int32_t* EmbeddedIds(const StageActivations& a) const {
    return layout_->vocab_split() ? a.local_inputs_.data() : a.inputs_.data();
  }
  // Sums a column-parallel GEMM's partial input gradient (N, C) over the tp group.
  Status ReduceInputGrad(float* dinp, size_t n);
  Status LayerForward(StageActivations& a, StageMemory& mem, int l);
  // Layer l's forward on parameters `p` already acquired: what LayerForward runs, and, with
  // `recompute`, what LayerBackward runs again for a recomputed layer (all but the MLP's
  // projection, whose output the first forward kept and backward does not read).
  Status LayerCompute(StageActivations& a, const float* p, int l, bool recompute);
  Status LayerBackward(StageActivations& a, StageMemory& mem, int l);
  Status HeadBackward(StageActivations& a, StageMemory& mem, float grad_scale);

  const GptLayout* layout_;
  Ops* ops_;
  parallel::Communicator* tp_;
  const Precision precision_;
  const int chunk_;
  const int l0_, l1_;          // the chunk's global layers [l0, l1)
  const bool embeds_, heads_;  // GptLayout::embeds, heads
};

}  // namespace drover::engine
