// GptDecoder: next-token logits for sampling, with a key/value cache.
//
// Gpt::NextTokenLogits runs the whole window through the model for every token it is asked
// for, and the LM head over every position of it: generating n tokens from a window of T
// costs n full forwards, most of it (for GPT-2's 50257-token vocabulary) the head's T x V
// logits of which one row is used. The decoder keeps each layer's keys and values of the
// tokens it has seen, so a token that extends the previous call's window costs one row
// through every layer and one row of logits.
//
// Positions are absolute (wpe), so the cache holds only while the window starts at the
// same token. Once the context outgrows maxT, every new token shifts the window by one and
// the decoder recomputes it (a prefill; still one row of logits, not maxT): the same
// last-maxT-tokens semantics as Gpt::NextTokenLogits, so both give the same logits within
// float rounding (GptDecoderTest pins it).
//
// Thread-safety: one thread at a time. The model's parameters must not change while the
// decoder is used (the cache was computed from them) and must outlive it.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/engine/model/gpt.h"

namespace drover::engine {

class GptDecoder {
 public:
  explicit GptDecoder(const Gpt& model);

  // Logits (V values, padding dropped) of the token that follows tokens[0..n), from the
  // last min(n, maxT) of them. Reuses the cache for the longest prefix of that window that
  // it holds (the whole window but the last token, when called once per generated token).
  // n >= 1; token ids in [0, V) (CHECKed).
  std::vector<float> NextTokenLogits(const int32_t* tokens, int n);

  // Tokens whose keys and values the cache holds (positions 0..cached()-1).
  int cached() const { return static_cast<int>(cached_.size()); }
  // Tokens the last call ran through the layers (1 when it extended the cached window).
  int computed() const { return computed_; }

 private:
  // Runs window[from..len) at positions from..len-1 through every layer, adding their keys
  // and values to the cache, which holds positions [0, from); returns the last row's logits.
  std::vector<float> Run(const int32_t* window, int from, int len);
  // Attention of `rows` queries at positions from.. over the cache: out (rows, C). For
  // from > 0; a prefill (from 0) takes the kernel table's attention.
  void Attend(float* out, const float* qkv, int layer, int from, int rows) const;

  const Gpt& model_;
  Ops* ops_;
  std::vector<float> keys_, values_;  // (L, maxT, C): position p of layer l at (l * maxT + p) * C
  std::vector<int32_t> cached_;       // the tokens at positions 0..cached()-1
  int computed_ = 0;
};

}  // namespace drover::engine
