#include "worker/engine/model/gpt_decoder.h"

#include <algorithm>

#include "worker/engine/model/gpt_inference.h"

namespace drover::engine {

GptDecoder::GptDecoder(const Gpt& model, Ops* ops)
    : model_(model),
      ops_(ops),
      params_(ModelParamsOn(model, ops, &params_copy_)),
      cache_(ops->Allocate(static_cast<size_t>(model.config().num_layers) *
                           model.config().max_seq_len * 3 * model.config().channels)),
      logits_(ops->Allocate(model.config().vocab_size)) {}

std::vector<float> GptDecoder::NextTokenLogits(const int32_t* tokens, int n) {
  const GptConfig& c = model_.config();
  DROVER_CHECK(n >= 1);
  const int len = std::min(n, c.max_seq_len);
  const int32_t* window = tokens + (n - len);
  for (int i = 0; i < len; ++i) {
    DROVER_CHECK_MSG(window[i] >= 0 && window[i] < c.vocab_size, "token id");
  }
  // The cache serves the prefix it shares with the window; the last token always runs,
  // since its row is the one whose logits are asked for.
  const int limit = std::min(cached(), len - 1);
  int keep = 0;
  while (keep < limit && cached_[keep] == window[keep]) ++keep;
  cached_.assign(window, window + len);
  computed_ = len - keep;
  return Run(window, keep, len);
}

void GptDecoder::Reserve(int rows) {
  if (rows <= reserved_rows_) return;
  const size_t rc = static_cast<size_t>(rows) * model_.config().channels;
  for (Buffer* b : {&x_, &res_, &ln_, &atty_}) *b = ops_->Allocate(rc);
  for (Buffer* b : {&fch_, &fchg_}) *b = ops_->Allocate(4 * rc);
  for (Buffer* b : {&mean_, &rstd_}) *b = ops_->Allocate(rows);
  reserved_rows_ = rows;
}

std::vector<float> GptDecoder::Run(const int32_t* window, int from, int len) {
  const GptConfig& c = model_.config();
  const GptLayout& layout = model_.layout();
  const int C = c.channels, V = c.vocab_size, NH = c.num_heads, maxT = c.max_seq_len;
  const int rows = len - from;
  Reserve(rows);
  const float* wte = params_ + model_.FindTensor("wte")->offset;  // (Vp, C)
  const float* wpe = params_ + model_.FindTensor("wpe")->offset;  // (maxT, C)
  constexpr Precision kF32 = Precision::kFp32;
  float* x = x_.data();
  float* res = res_.data();
  float* ln = ln_.data();
  float* atty = atty_.data();

  // x (rows, C) = wte[token] + wpe[position]: the positions from on are wpe's rows from on.
  ops_->EncoderForward(x, window + from, wte, wpe + static_cast<size_t>(from) * C, 1, rows, C,
                       kF32);
  const LayerOffsets& o = layout.layer_offsets();
  for (int l = 0; l < c.num_layers; ++l) {
    const float* w = params_ + layout.LayerRange(l).first;
    float* qkv = cache_.data() + static_cast<size_t>(l) * maxT * 3 * C;  // (maxT, 3C)
    ops_->LayerNormForward(ln, mean_.data(), rstd_.data(), x, w + o.ln1w, w + o.ln1b, rows, C,
                           kF32);
    // The new rows' q | k | v, written into the cache after the positions it holds.
    ops_->MatmulForward(qkv + static_cast<size_t>(from) * 3 * C, false, ln, w + o.qkvw, w + o.qkvb,
                        nullptr, rows, C, 3 * C, 3 * C, kF32);
    if (from == 0) {
      // A prefill: the table's causal attention over the whole window, far faster for
      // long windows than a query at a time.
      const size_t state = ops_->AttentionStateFloats(1, rows, C, NH, kF32);
      if (state_.size() < state) state_ = ops_->Allocate(state);
      ops_->AttentionForward(atty, state_.data(), qkv, 1, rows, C, NH, kF32);
    } else {
      ops_->AttentionDecode(atty, qkv, from, rows, C, NH);
    }
    // res = x + atty @ attprojw^T + attprojb; x = res + gelu(ln2(res) @ fcw^T + fcb) @ ...
    ops_->MatmulForward(res, false, atty, w + o.attprojw, w + o.attprojb, x, rows, C, C, C, kF32);
    ops_->LayerNormForward(ln, mean_.data(), rstd_.data(), res, w + o.ln2w, w + o.ln2b, rows, C,
                           kF32);
    ops_->MatmulForward(fch_.data(), false, ln, w + o.fcw, w + o.fcb, nullptr, rows, C, 4 * C,
                        4 * C, kF32);
    ops_->GeluForward(fchg_.data(), fch_.data(), 4 * static_cast<size_t>(rows) * C, kF32);
    ops_->MatmulForward(x, false, fchg_.data(), w + o.fcprojw, w + o.fcprojb, res, rows, 4 * C, C,
                        C, kF32);
  }
  // The final LayerNorm and the tied head, for the last row only.
  const float* lnf = params_ + model_.FindTensor("lnfw")->offset;
  ops_->LayerNormForward(ln, mean_.data(), rstd_.data(), x + static_cast<size_t>(rows - 1) * C, lnf,
                         lnf + C, 1, C, kF32);
  ops_->MatmulForward(logits_.data(), false, ln, wte, nullptr, nullptr, 1, C, V, V, kF32);
  std::vector<float> logits(V);
  ops_->ToHost(logits.data(), logits_.data(), V);
  return logits;
}

}  // namespace drover::engine
