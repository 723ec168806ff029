// The model FLOPs of training a GPT-2 (DESIGN.md's model): what model FLOPs utilisation
// (MFU) counts, the arithmetic the model needs whatever the implementation does (a
// recomputed forward, padding of the vocabulary and rounding passes are not counted).
#pragma once

#include "common/job_spec.h"

namespace drover::engine {

// FLOPs per token trained at sequence length T: 6 N for the weights' products (2 N forward,
// 4 N backward, N every parameter, the embeddings' included) and 12 L C T for attention's
// two T x T products in both directions, counted whole though causal attention needs half
// of them. The convention of nanoGPT, PaLM's appendix and tests/device/speed.sh, so that an
// MFU here compares with theirs.
inline double ModelFlopsPerToken(const ModelSpec& m, int T) {
  const double L = m.n_layer, C = m.n_embd, V = m.vocab_size, P = m.block_size;
  // Token and position embeddings, per block two LayerNorms (4C), attention (4C^2 + 4C) and
  // the MLP (8C^2 + 5C), the final LayerNorm.
  const double n = V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C;
  return 6 * n + 12 * L * C * T;
}

}  // namespace drover::engine
