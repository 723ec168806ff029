#include "worker/engine/model/gpt_stage.h"

#include <algorithm>

namespace drover::engine {
namespace {

// Points ptrs[i] at consecutive buffers of sizes[i] floats from `base` (null: only
// measure) and returns the number of floats used.
size_t LayoutBuffers(float* base, float** ptrs[], int nptrs, const size_t sizes[]) {
  size_t off = 0;
  for (int i = 0; i < nptrs; i++) {
    if (base != nullptr) *ptrs[i] = base + off;
    // Round every buffer to 16 floats (64 bytes) so rows start cache-line aligned.
    off += (sizes[i] + 15) / 16 * 16;
  }
  return off;
}

// Under a vocabulary split, `ids` as rows of this rank's slice of wte, -1 for a token
// another tp rank holds (ops.h), written into `local`; else `ids` themselves.
const int32_t* LocalIds(const GptLayout& layout, const std::vector<int32_t>& ids,
                        std::vector<int32_t>& local) {
  if (!layout.vocab_split()) return ids.data();
  const int begin = layout.vocab_begin(), end = begin + layout.local_vocab();
  for (size_t i = 0; i < ids.size(); ++i) {
    local[i] = ids[i] >= begin && ids[i] < end ? ids[i] - begin : -1;
  }
  return local.data();
}

// The layers of `chunk` that `recompute` (a count, or negative for all) recomputes.
int RecomputedLayers(const GptLayout& layout, int chunk, int recompute) {
  const int layers = layout.chunk_end_layer(chunk) - layout.chunk_first_layer(chunk);
  return recompute < 0 ? layers : std::min(recompute, layers);
}

}  // namespace

StageActivations::StageActivations(const GptLayout* layout, Ops* ops, Precision precision,
                                   int chunk, int recompute)
    : layout_(layout),
      ops_(ops),
      precision_(precision),
      chunk_(chunk),
      recomputed_(RecomputedLayers(*layout, chunk, recompute)) {}

void StageActivations::Ensure(int B, int T) {
  const GptConfig& cfg = layout_->config();
  DROVER_CHECK(B >= 1 && T >= 1 && T <= cfg.max_seq_len);
  const size_t L = layout_->chunk_end_layer(chunk_) - layout_->chunk_first_layer(chunk_);
  // Slices of the per-layer buffers: one per kept layer, and one when all are recomputed.
  const size_t R = static_cast<size_t>(recomputed_);
  const size_t S = L == 0 ? 0 : std::max<size_t>(L - R, 1);
  const size_t C = cfg.channels, Ca = layout_->attn_channels(), C4 = layout_->mlp_channels();
  const size_t NHa = layout_->local_heads();
  const size_t BT = static_cast<size_t>(B) * T;
  // The head's buffers exist on the last stage's last chunk only.
  const size_t last = layout_->heads(chunk_) ? 1 : 0;
  const size_t Vl = layout_->local_vocab();
  // The vocabulary split's loss buffers, on the last stage.
  const size_t split = last * (layout_->vocab_split() ? 1 : 0);
  const size_t tp = layout_->tp_size();
  const size_t att_floats =
      ops_->AttentionStateFloats(B, T, static_cast<int>(Ca), static_cast<int>(NHa), precision_);
  // Operand buffers (ops.h) in the table's format; a slice per layer, 64-byte aligned.
  op_btc_ = OperandStride(BT * C);
  // dres_copy_ where operand buffers are narrower than floats (GptStage::LayerBackward).
  const size_t copies =
      precision_ != Precision::kFp32 && ops_->OperandFloats(BT * C, precision_) < BT * C ? 1 : 0;
  op_btca_ = OperandStride(BT * Ca);
  op_qkv_ = OperandStride(BT * 3 * Ca);
  op_btc4_ = OperandStride(BT * C4);
  float** ptrs[] = {&encoded_,   &ln1_,           &ln1_mean_, &ln1_rstd_, &qkv_,      &atty_,
                    &att_,       &residual2_,     &ln2_,      &ln2_mean_, &ln2_rstd_, &fch_,
                    &fch_gelu_,  &residual3_,     &lnf_,      &lnf_mean_, &lnf_rstd_, &logits_,
                    &losses_,    &lse_,           &dres_,     &dbtc_,     &dqkv_,     &dfch_,
                    &lse_parts_, &target_logits_, &dres_copy_};
  const size_t sizes[] = {
      BT * C,          S * op_btc_, S * BT,
      S * BT,          S * op_qkv_, S * op_btca_,
      S * att_floats,  S * BT * C,  S * op_btc_,
      S * BT,          S * BT,      S * op_btc4_,
      S * op_btc4_,    L * BT * C,  last * op_btc_,
      last * BT,       last * BT,   last * OperandStride(BT * Vl),
      last * BT,       last * BT,   BT * C,
      BT * C,          op_qkv_,     op_btc4_,
      split * tp * BT, split * BT,  copies * op_btc_,
  };
  constexpr int n = sizeof(sizes) / sizeof(sizes[0]);
  static_assert(n == sizeof(ptrs) / sizeof(ptrs[0]));
  const size_t need = LayoutBuffers(nullptr, ptrs, n, sizes);
  if (need > arena_.size()) arena_ = ops_->Allocate(need);
  LayoutBuffers(arena_.data(), ptrs, n, sizes);
  B_ = B;
  T_ = T;
  att_floats_ = att_floats;
  inputs_.resize(BT);
  targets_.resize(BT);
  if (layout_->vocab_split()) {
    local_inputs_.resize(BT);
    local_targets_.resize(BT);
  }
  backward_ready_ = false;
  if (copies == 0) dres_copy_ = nullptr;
  dres_copied_ = false;
}

size_t StageActivations::OperandStride(size_t n) const {
  return (ops_->OperandFloats(n, precision_) + 15) / 16 * 16;
}

const float* StageActivations::output() const {
  const size_t L = layout_->chunk_end_layer(chunk_) - layout_->chunk_first_layer(chunk_);
  const size_t btc = static_cast<size_t>(B_) * T_ * layout_->config().channels;
  return L == 0 ? encoded_ : residual3_ + (L - 1) * btc;
}

GptStage::GptStage(const GptLayout* layout, Ops* ops, parallel::Communicator* tp,
                   Precision precision, int chunk)
    : layout_(layout),
      ops_(ops),
      tp_(tp),
      precision_(precision),
      chunk_(chunk),
      l0_(layout->chunk_first_layer(chunk)),
      l1_(layout->chunk_end_layer(chunk)),
      embeds_(layout->embeds(chunk)),
      heads_(layout->heads(chunk)) {
  DROVER_CHECK((layout->tp_size() > 1) == (tp != nullptr));
  DROVER_CHECK(tp == nullptr || tp->size() == layout->tp_size());
}

Status GptStage::RowParallelForward(float* out, const float* inp, const float* w, const float* bias,
                                    const float* residual, int N, int IC, int OC) {
  // out is the residual stream: fp32 in every precision (GptStage's header says why), so
  // the GEMM's sum is stored as it comes, with no rounding pass.
  if (tp_ == nullptr) {
    ops_->MatmulForward(out, false, inp, w, bias, residual, N, IC, OC, OC, precision_);
    return OkStatus();
  }
  // Rank 0 folds bias and residual into its partial product; the sum adds them once. The
  // partial sums travel in fp32, as one GEMM's would be summed.
  const bool adds = tp_->rank() == 0;
  ops_->MatmulForward(out, false, inp, w, adds ? bias : nullptr, adds ? residual : nullptr, N, IC,
                      OC, OC, precision_);
  return tp_->AllReduce(out, static_cast<size_t>(N) * OC, parallel::DataType::kFloat32,
                        parallel::ReduceOp::kSum);
}

Status GptStage::ReduceInputGrad(float* dinp, size_t n) {
  if (tp_ != nullptr) {
    RETURN_IF_ERROR(
        tp_->AllReduce(dinp, n, parallel::DataType::kFloat32, parallel::ReduceOp::kSum));
  }
  Written(dinp, n);
  return OkStatus();
}

Status GptStage::LayerForward(StageActivations& a, StageMemory& mem, int l) {
  const int unit = layout_->layer_unit(l);
  if (l + 1 < l1_) {
    mem.PrefetchParams(unit + 1);
  } else if (heads_) {
    // The head follows the last layer: its wte is large, start fetching it now.
    mem.PrefetchParams(layout_->final_norm_unit());
    mem.PrefetchParams(layout_->head_unit());
  }
  ASSIGN_OR_RETURN(const float* p, mem.AcquireParams(unit));
  RETURN_IF_ERROR(LayerCompute(a, p, l, /*recompute=*/false));
  return mem.ReleaseParams(unit);
}

Status GptStage::LayerCompute(StageActivations& a, const float* p, int l, bool recompute) {
  const int B = a.B_, T = a.T_, BT = B * T;
  const int C = layout_->config().channels, Ca = layout_->attn_channels();
  const int C4 = layout_->mlp_channels(), NHa = layout_->local_heads();
  const size_t i = l - l0_, s = a.Slot(i);
  const size_t btc = static_cast<size_t>(BT) * C;
  const LayerOffsets& o = layout_->layer_offsets();
  const float* x = i == 0 ? a.encoded_ : a.residual3_ + (i - 1) * btc;
  float* ln1 = a.ln1_ + s * a.op_btc_;
  float* qkv = a.qkv_ + s * a.op_qkv_;
  float* atty = a.atty_ + s * a.op_btca_;
  float* att = a.att_ + s * a.att_floats_;
  float* res2 = a.residual2_ + s * btc;
  float* ln2 = a.ln2_ + s * a.op_btc_;
  float* fch = a.fch_ + s * a.op_btc4_;
  float* fchg = a.fch_gelu_ + s * a.op_btc4_;
  float* res3 = a.residual3_ + i * btc;
  ops_->LayerNormForward(ln1, a.ln1_mean_ + s * BT, a.ln1_rstd_ + s * BT, x, p + o.ln1w, p + o.ln1b,
                         BT, C, precision_);
  ops_->MatmulForward(qkv, true, ln1, p + o.qkvw, p + o.qkvb, nullptr, BT, C, 3 * Ca, 3 * Ca,
                      precision_);
  Written(qkv, static_cast<size_t>(BT) * 3 * Ca);
  ops_->AttentionForward(atty, att, qkv, B, T, Ca, NHa, precision_);
  RETURN_IF_ERROR(RowParallelForward(res2, atty, p + o.attprojw, p + o.attprojb, x, BT, Ca, C));
  ops_->LayerNormForward(ln2, a.ln2_mean_ + s * BT, a.ln2_rstd_ + s * BT, res2, p + o.ln2w,
                         p + o.ln2b, BT, C, precision_);
  // fc is column-parallel: each rank's C4 columns and their GELU are its own, no sum between.
  ops_->MatmulGeluForward(fchg, fch, ln2, p + o.fcw, p + o.fcb, BT, C, C4, precision_);
  // What backward reads ends here. A recomputation stops: the layer's output is in
  // residual3_ from the first forward (and a pipeline's send of it may still be reading it),
  // so the MLP's projection, a third of the layer's GEMM work, and its all-reduce are saved.
  if (recompute) return OkStatus();
  return RowParallelForward(res3, fchg, p + o.fcprojw, p + o.fcprojb, res2, BT, C4, C);
}

StatusOr<float> GptStage::Forward(StageActivations& a, StageMemory& mem, Pass pass,
                                  std::optional<float> grad_scale) {
  const GptConfig& cfg = layout_->config();
  const int B = a.B_, T = a.T_, BT = B * T;
  const int C = cfg.channels, V = cfg.vocab_size;
  DROVER_CHECK(B >= 1 && T >= 1);
  DROVER_CHECK_MSG(a.precision_ == precision_, "activations laid out for another precision");
  DROVER_CHECK_MSG(a.chunk_ == chunk_, "activations laid out for another chunk");
  a.backward_ready_ = false;
  a.seeded_.reset();
  if (embeds_) {
    for (int i = 0; i < BT; i++)
      DROVER_CHECK_MSG(a.inputs_[i] >= 0 && a.inputs_[i] < V, "token id");
    const int e = layout_->embedding_unit();
    if (l1_ > l0_) mem.PrefetchParams(layout_->layer_unit(l0_));
    ASSIGN_OR_RETURN(const float* p, mem.AcquireParams(e));
    ops_->EncoderForward(a.encoded_, LocalIds(*layout_, a.inputs_, a.local_inputs_), p,
                         p + layout_->wpe_offset(), B, T, C, Precision::kFp32);
    RETURN_IF_ERROR(mem.ReleaseParams(e));
    if (layout_->vocab_split()) {
      // Each token's row came from the one rank holding it, zeros from the others: the sum
      // is exact, the single-process embedding.
      RETURN_IF_ERROR(tp_->AllReduce(a.encoded_, static_cast<size_t>(BT) * C,
                                     parallel::DataType::kFloat32, parallel::ReduceOp::kSum));
    }
  }
  for (int l = l0_; l < l1_; ++l) RETURN_IF_ERROR(LayerForward(a, mem, l));
  if (!heads_) return 0.0f;

  const int f = layout_->final_norm_unit(), h = layout_->head_unit();
  ASSIGN_OR_RETURN(const float* pf, mem.AcquireParams(f));
  ASSIGN_OR_RETURN(const float* ph, mem.AcquireParams(h));
  ops_->LayerNormForward(a.lnf_, a.lnf_mean_, a.lnf_rstd_, a.output(), pf, pf + C, BT, C,
                         precision_);
  // Tied LM head, into an operand buffer; the softmax and the loss read the narrowed logits
  // and compute in fp32. Every column of the (padded) vocabulary or its slice is computed:
  // the padding rows' logits are zeros the loss skips, for 0.1% more work on GPT-2, and
  // extents that are multiples of 128 take cuBLAS's aligned kernels. With V = 50257 columns
  // the head's forward took 26.5 ms and its input gradient 19.4 ms of a 145 ms GPT-2 124M
  // step on an H200 (unaligned sm75 kernels); with Vp, 3.5 and 3.1 ms.
  const int Vl = layout_->local_vocab();
  ops_->MatmulForward(a.logits_, true, a.lnf_, ph, nullptr, nullptr, BT, C, Vl, Vl, precision_);
  Written(a.logits_, static_cast<size_t>(BT) * Vl);
  if (pass != Pass::kTrain) {
    // Backward would need both again; without it they go now.
    RETURN_IF_ERROR(mem.ReleaseParams(h));
    RETURN_IF_ERROR(mem.ReleaseParams(f));
  }
  if (pass == Pass::kLogits) return 0.0f;
  for (int i = 0; i < BT; i++) {
    DROVER_CHECK_MSG(a.targets_[i] >= 0 && a.targets_[i] < V, "target id");
  }
  a.backward_ready_ = pass == Pass::kTrain;
  if (!layout_->vocab_split()) {
    if (pass == Pass::kTrain && grad_scale.has_value()) {
      // dlogits over the logits here, as HeadBackward would write them.
      a.seeded_ = grad_scale;
      return ops_->CrossEntropyForwardBackward(a.logits_, a.losses_, a.lse_, a.logits_,
                                               a.targets_.data(), *grad_scale / BT, BT, V, Vl,
                                               precision_);
    }
    return ops_->CrossEntropyForward(a.losses_, a.lse_, a.logits_, a.targets_.data(), BT, V, Vl,
                                     precision_);
  }
  // The loss over the split vocabulary (Megatron's): each rank's log-sum-exp of its slice,
  // gathered and combined, and the target's logit from the rank that holds it.
  const int32_t* targets = LocalIds(*layout_, a.targets_, a.local_targets_);
  const size_t n = static_cast<size_t>(BT);
  ops_->CrossEntropyPartForward(a.lse_parts_ + layout_->tp_rank() * n, a.target_logits_, a.logits_,
                                targets, BT, layout_->live_vocab(), Vl, precision_);
  RETURN_IF_ERROR(tp_->AllGather(a.lse_parts_, std::vector<size_t>(layout_->tp_size(), n),
                                 parallel::DataType::kFloat32));
  RETURN_IF_ERROR(
      tp_->AllReduce(a.target_logits_, n, parallel::DataType::kFloat32, parallel::ReduceOp::kSum));
  return ops_->CrossEntropyCombine(a.losses_, a.lse_, a.lse_parts_, a.target_logits_,
                                   layout_->tp_size(), BT);
}

Status GptStage::HeadBackward(StageActivations& a, StageMemory& mem, float grad_scale) {
  const GptConfig& cfg = layout_->config();
  const int BT = a.B_ * a.T_;
  const int C = cfg.channels, V = cfg.vocab_size;
  const int f = layout_->final_norm_unit(), h = layout_->head_unit();
  // The Forward (kTrain) left both acquired; these acquisitions only fetch the pointers.
  ASSIGN_OR_RETURN(const float* pf, mem.AcquireParams(f));
  ASSIGN_OR_RETURN(const float* ph, mem.AcquireParams(h));
  bool acc = false;
  ASSIGN_OR_RETURN(float* gh, mem.AcquireGrads(h, &acc));
  // Stored narrowed: where fp16 without loss scaling loses small gradients to zero. Split,
  // the lse is the combined one and the targets are rows of the slice (ops.h).
  const bool split = layout_->vocab_split();
  const int Vl = layout_->local_vocab();
  if (a.seeded_.has_value()) {
    DROVER_CHECK_MSG(*a.seeded_ == grad_scale, "Backward's grad_scale is not the Forward's");
  } else {
    ops_->CrossEntropyBackward(a.logits_, a.logits_, a.lse_,
                               split ? a.local_targets_.data() : a.targets_.data(), grad_scale / BT,
                               BT, split ? layout_->live_vocab() : V, Vl, precision_);
  }
  // Every column, as in the forward: the padding columns' gradients are zeros, and so are
  // the padding rows' weight gradients it writes.
  // The final LayerNorm's output gradient: an operand buffer unless a vocabulary split sums
  // it over the tp group (in fp32), as the blocks' LayerNorms' below.
  ops_->MatmulBackward(a.dbtc_, !split, gh, nullptr, a.logits_, true, a.lnf_, ph, BT, C, Vl, Vl,
                       acc, precision_);
  if (split) {
    // Each rank's slice gives part of the final LayerNorm's output gradient.
    RETURN_IF_ERROR(ReduceInputGrad(a.dbtc_, static_cast<size_t>(BT) * C));
  } else {
    Written(a.dbtc_, static_cast<size_t>(BT) * C);
  }
  if (!acc) {
    // Every row of the slice was overwritten; on a single stage wpe, which the encoder's
    // backward only adds to, needs its zeros written.
    if (h == layout_->embedding_unit()) {
      ops_->Fill(gh + layout_->wpe_offset(), 0.0f, static_cast<size_t>(cfg.max_seq_len) * C);
    }
  }
  RETURN_IF_ERROR(mem.ReleaseParams(h));
  RETURN_IF_ERROR(mem.ReleaseParams(h));
  // Ready now, also when the embedding shares the unit and the memory wants it so: its rows
  // follow at the very end (StageMemory::AddEmbeddingGrads), and the dense part can be
  // reduced meanwhile.
  if (h != layout_->embedding_unit() || mem.TiedUnitReadyAfterHead()) {
    RETURN_IF_ERROR(mem.GradsReady(h));
  }

  ASSIGN_OR_RETURN(float* gf, mem.AcquireGrads(f, &acc));
  ops_->Fill(a.dres_, 0.0f, static_cast<size_t>(BT) * C);
  ops_->LayerNormBackward(a.dres_, a.dres_copy_, gf, gf + C, a.dbtc_, !split, a.output(), pf,
                          a.lnf_mean_, a.lnf_rstd_, BT, C, acc, precision_);
  a.dres_copied_ = a.dres_copy_ != nullptr;
  RETURN_IF_ERROR(mem.ReleaseParams(f));
  RETURN_IF_ERROR(mem.ReleaseParams(f));
  return mem.GradsReady(f);
}

Status GptStage::LayerBackward(StageActivations& a, StageMemory& mem, int l) {
  const int B = a.B_, T = a.T_, BT = B * T;
  const int C = layout_->config().channels, Ca = layout_->attn_channels();
  const int C4 = layout_->mlp_channels(), NHa = layout_->local_heads();
  const size_t i = l - l0_, s = a.Slot(i);
  const size_t btc = static_cast<size_t>(BT) * C;
  const int unit = layout_->layer_unit(l);
  if (l > l0_) mem.PrefetchParams(unit - 1);
  ASSIGN_OR_RETURN(const float* p, mem.AcquireParams(unit));
  if (i < static_cast<size_t>(a.recomputed_)) {
    RETURN_IF_ERROR(LayerCompute(a, p, l, /*recompute=*/true));
  }
  bool acc = false;
  ASSIGN_OR_RETURN(float* g, mem.AcquireGrads(unit, &acc));
  const LayerOffsets& o = layout_->layer_offsets();
  const float* x = i == 0 ? a.encoded_ : a.residual3_ + (i - 1) * btc;
  // Every buffer of the MLP's backward but dres is an operand buffer. fcproj is row-parallel:
  // each rank's dfch is the gradient of its own C4 columns, whole without a sum.
  // dres, the residual stream's gradient, is what the two projections' backwards read: as
  // the 16-bit copy the LayerNorm backward before made of it, where it made one (a 16-bit
  // operand table), so that the GEMMs need not narrow it themselves, a pass over it each.
  const bool copied = a.dres_copied_;
  const float* dres = copied ? a.dres_copy_ : a.dres_;
  ops_->GeluMatmulBackward(a.dfch_, g + o.fcprojw, g + o.fcprojb, dres, copied,
                           a.fch_gelu_ + s * a.op_btc4_, p + o.fcprojw, a.fch_ + s * a.op_btc4_, BT,
                           C4, C, acc, precision_);
  // The LayerNorms' output gradients are operand buffers where no tp group sums them (in
  // fp32): only the LayerNorm's backward reads them.
  const bool summed = tp_ != nullptr;
  ops_->MatmulBackward(a.dbtc_, !summed, g + o.fcw, g + o.fcb, a.dfch_, true,
                       a.ln2_ + s * a.op_btc_, p + o.fcw, BT, C, C4, C4, acc, precision_);
  RETURN_IF_ERROR(ReduceInputGrad(a.dbtc_, btc));
  ops_->LayerNormBackward(a.dres_, a.dres_copy_, g + o.ln2w, g + o.ln2b, a.dbtc_, !summed,
                          a.residual2_ + s * btc, p + o.ln2w, a.ln2_mean_ + s * BT,
                          a.ln2_rstd_ + s * BT, BT, C, acc, precision_);
  // The attention's output gradient: an operand buffer, which only attention's backward reads
  // (the projection is row-parallel: a tp rank's heads' gradient is its own, summed nowhere).
  ops_->MatmulBackward(a.dbtc_, true, g + o.attprojw, g + o.attprojb,
                       a.dres_copy_ != nullptr ? a.dres_copy_ : a.dres_, a.dres_copy_ != nullptr,
                       a.atty_ + s * a.op_btca_, p + o.attprojw, BT, Ca, C, C, acc, precision_);
  Written(a.dbtc_, static_cast<size_t>(BT) * Ca);
  ops_->AttentionBackward(a.dqkv_, a.dbtc_, true, a.atty_ + s * a.op_btca_,
                          a.att_ + s * a.att_floats_, a.qkv_ + s * a.op_qkv_, B, T, Ca, NHa,
                          precision_);
  ops_->MatmulBackward(a.dbtc_, !summed, g + o.qkvw, g + o.qkvb, a.dqkv_, true,
                       a.ln1_ + s * a.op_btc_, p + o.qkvw, BT, C, 3 * Ca, 3 * Ca, acc, precision_);
  RETURN_IF_ERROR(ReduceInputGrad(a.dbtc_, btc));
  // The stage's first layer's dres goes to the embedding or the stage before, as floats.
  float* copy = i > 0 ? a.dres_copy_ : nullptr;
  ops_->LayerNormBackward(a.dres_, copy, g + o.ln1w, g + o.ln1b, a.dbtc_, !summed, x, p + o.ln1w,
                          a.ln1_mean_ + s * BT, a.ln1_rstd_ + s * BT, BT, C, acc, precision_);
  a.dres_copied_ = copy != nullptr;
  RETURN_IF_ERROR(mem.ReleaseParams(unit));
  return mem.GradsReady(unit);
}

Status GptStage::Backward(StageActivations& a, StageMemory& mem, float grad_scale) {
  DROVER_CHECK_MSG(a.chunk_ == chunk_, "activations laid out for another chunk");
  a.dres_copied_ = false;  // dres is the received doutput() on a stage without the head
  if (heads_) {
    DROVER_CHECK_MSG(a.backward_ready_,
                     "Backward needs a Forward with targets (a training pass) right before");
    a.backward_ready_ = false;  // the logits buffer becomes dlogits
    RETURN_IF_ERROR(HeadBackward(a, mem, grad_scale));
  }
  for (int l = l1_ - 1; l >= l0_; --l) RETURN_IF_ERROR(LayerBackward(a, mem, l));
  if (!embeds_) return OkStatus();
  const int e = layout_->embedding_unit();
  if (e == layout_->head_unit()) {
    // The head wrote (and zero-filled) this unit, and made it ready already if the memory
    // wanted it so.
    RETURN_IF_ERROR(mem.AddEmbeddingGrads(e, EmbeddedIds(a), a.dres_, a.B_, a.T_));
    return mem.TiedUnitReadyAfterHead() ? OkStatus() : mem.GradsReady(e);
  }
  bool acc = false;
  ASSIGN_OR_RETURN(float* ge, mem.AcquireGrads(e, &acc));
  // The embedding's backward scatter-adds: zeros underneath when nothing else wrote this
  // unit in this micro-batch.
  if (!acc) ops_->Fill(ge, 0.0f, layout_->units()[e].numel);
  RETURN_IF_ERROR(mem.AddEmbeddingGrads(e, EmbeddedIds(a), a.dres_, a.B_, a.T_));
  return mem.GradsReady(e);
}

}  // namespace drover::engine
