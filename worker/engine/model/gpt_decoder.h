// GptDecoder: next-token logits for sampling, with a key/value cache, on any kernel table
// (the CPU's, or the GPU's through CudaOps: `drover sample --device cuda`).
//
// Gpt::NextTokenLogits runs the whole window through the model for every token it is asked
// for, and the LM head over every position of it: generating n tokens from a window of T
// costs n full forwards, most of it (for GPT-2's 50257-token vocabulary) the head's T x V
// logits of which one row is used. The decoder keeps each layer's keys and values of the
// tokens it has seen, so a token that extends the previous call's window costs one row
// through every layer (Ops::AttentionDecode against the cache) and one row of logits.
//
// Positions are absolute (wpe), so the cache holds only while the window starts at the
// same token. Once the context outgrows maxT, every new token shifts the window by one and
// the decoder recomputes it (a prefill; still one row of logits, not maxT): the same
// last-maxT-tokens semantics as Gpt::NextTokenLogits, so both give the same logits within
// float rounding (GptDecoderTest pins it).
//
// In fp32 on every table. Memory, in the table's: the cache, each layer's q, k and v of every
// position (L x maxT x 3C floats: the query rows ride along so that a layer's QKV GEMM writes
// straight into it and a prefill is the table's own attention over it), the activations of
// the largest run so far, and on a table other than the CPU's a copy of the parameters.
//
// Thread-safety: one thread at a time. The model's parameters must not change while the
// decoder is used (the cache was computed from them) and must outlive it.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt.h"

namespace drover::engine {

class GptDecoder {
 public:
  // `ops` is not owned and lives as long as this (CpuOps(), CudaOps()).
  explicit GptDecoder(const Gpt& model, Ops* ops = CpuOps());
  GptDecoder(const GptDecoder&) = delete;
  GptDecoder& operator=(const GptDecoder&) = delete;

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
  // The activation buffers hold at least `rows` rows.
  void Reserve(int rows);

  const Gpt& model_;
  Ops* ops_;
  Buffer params_copy_;     // the parameters on a table other than the CPU's; empty there
  const float* params_;    // the model's own arena, or params_copy_
  Buffer cache_;           // (L, maxT, 3C): position p of layer l at (l * maxT + p) * 3C
  int reserved_rows_ = 0;  // what the buffers below hold
  Buffer x_, res_, ln_, atty_, fch_, fchg_, mean_, rstd_, state_, logits_;
  std::vector<int32_t> cached_;  // the tokens at positions 0..cached()-1
  int computed_ = 0;
};

}  // namespace drover::engine
