#include "worker/engine/model/gpt_decoder.h"

#include <algorithm>
#include <cmath>

namespace drover::engine {

GptDecoder::GptDecoder(const Gpt& model) : model_(model), ops_(CpuOps()) {
  const GptConfig& c = model.config();
  const size_t cache = static_cast<size_t>(c.num_layers) * c.max_seq_len * c.channels;
  keys_.resize(cache);
  values_.resize(cache);
}

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

std::vector<float> GptDecoder::Run(const int32_t* window, int from, int len) {
  const GptConfig& c = model_.config();
  const GptLayout& layout = model_.layout();
  const int C = c.channels, V = c.vocab_size, maxT = c.max_seq_len;
  const int rows = len - from;
  const size_t rc = static_cast<size_t>(rows) * C;
  const float* params = model_.params();
  const float* wte = params + model_.FindTensor("wte")->offset;  // (Vp, C)
  const float* wpe = params + model_.FindTensor("wpe")->offset;  // (maxT, C)
  std::vector<float> x(rc), res(rc), ln(rc), atty(rc), qkv(3 * rc), fch(4 * rc), fchg(4 * rc);
  std::vector<float> mean(rows), rstd(rows), att;

  for (int i = 0; i < rows; ++i) {  // x (rows, C) = wte[token] + wpe[position]
    const float* e = wte + static_cast<size_t>(window[from + i]) * C;
    const float* p = wpe + static_cast<size_t>(from + i) * C;
    for (int k = 0; k < C; ++k) x[static_cast<size_t>(i) * C + k] = e[k] + p[k];
  }
  const LayerOffsets& o = layout.layer_offsets();
  constexpr Precision kF32 = Precision::kFp32;
  for (int l = 0; l < c.num_layers; ++l) {
    const float* w = params + layout.LayerRange(l).first;
    ops_->LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data(), w + o.ln1w, w + o.ln1b,
                           rows, C, kF32);
    ops_->MatmulForward(qkv.data(), false, ln.data(), w + o.qkvw, w + o.qkvb, nullptr, rows, C,
                        3 * C, 3 * C, kF32);  // (rows, 3C): q | k | v
    for (int i = 0; i < rows; ++i) {
      const float* row = qkv.data() + static_cast<size_t>(i) * 3 * C;
      const size_t at = (static_cast<size_t>(l) * maxT + from + i) * C;
      std::copy(row + C, row + 2 * C, keys_.data() + at);
      std::copy(row + 2 * C, row + 3 * C, values_.data() + at);
    }
    if (from == 0) {
      // A prefill: the table's causal attention over the whole window, far faster for
      // long windows than a query at a time.
      att.resize(ops_->AttentionStateFloats(1, rows, C, c.num_heads, kF32));
      ops_->AttentionForward(atty.data(), att.data(), qkv.data(), 1, rows, C, c.num_heads, kF32);
    } else {
      Attend(atty.data(), qkv.data(), l, from, rows);
    }
    // res = x + atty @ attprojw^T + attprojb; x = res + gelu(ln2(res) @ fcw^T + fcb) @ ...
    ops_->MatmulForward(res.data(), false, atty.data(), w + o.attprojw, w + o.attprojb, x.data(),
                        rows, C, C, C, kF32);
    ops_->LayerNormForward(ln.data(), mean.data(), rstd.data(), res.data(), w + o.ln2w, w + o.ln2b,
                           rows, C, kF32);
    ops_->MatmulForward(fch.data(), false, ln.data(), w + o.fcw, w + o.fcb, nullptr, rows, C, 4 * C,
                        4 * C, kF32);
    ops_->GeluForward(fchg.data(), fch.data(), 4 * rc, kF32);
    ops_->MatmulForward(x.data(), false, fchg.data(), w + o.fcprojw, w + o.fcprojb, res.data(),
                        rows, 4 * C, C, C, kF32);
  }
  // The final LayerNorm and the tied head, for the last row only.
  const float* lnf = params + model_.FindTensor("lnfw")->offset;
  ops_->LayerNormForward(ln.data(), mean.data(), rstd.data(), x.data() + rc - C, lnf, lnf + C, 1, C,
                         kF32);
  std::vector<float> logits(V);
  ops_->MatmulForward(logits.data(), false, ln.data(), wte, nullptr, nullptr, 1, C, V, V, kF32);
  return logits;
}

void GptDecoder::Attend(float* out, const float* qkv, int layer, int from, int rows) const {
  const GptConfig& c = model_.config();
  const int C = c.channels, NH = c.num_heads, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float* keys = keys_.data() + static_cast<size_t>(layer) * c.max_seq_len * C;
  const float* values = values_.data() + static_cast<size_t>(layer) * c.max_seq_len * C;
#pragma omp parallel
  {
    std::vector<float> att(from + rows);
#pragma omp for collapse(2) schedule(static)
    for (int i = 0; i < rows; ++i) {
      for (int h = 0; h < NH; ++h) {
        // Query at position t = from + i sees keys 0..t (causal).
        const int t = from + i;
        const float* q = qkv + static_cast<size_t>(i) * 3 * C + h * hs;
        float max = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          const float* k = keys + static_cast<size_t>(j) * C + h * hs;
          float dot = 0.0f;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          att[j] = dot * scale;
          max = std::max(max, att[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j <= t; ++j) {
          att[j] = std::exp(att[j] - max);
          sum += att[j];
        }
        float* y = out + static_cast<size_t>(i) * C + h * hs;
        std::fill(y, y + hs, 0.0f);
        for (int j = 0; j <= t; ++j) {
          const float* v = values + static_cast<size_t>(j) * C + h * hs;
          const float p = att[j] / sum;
          for (int d = 0; d < hs; ++d) y[d] += p * v[d];
        }
      }
    }
  }
}

}  // namespace drover::engine
