// Softmax + cross-entropy, fused, over logits whose rows are padded to Vp columns.
//
// The forward never writes probabilities: it keeps each row's log-sum-exp, so the logits
// stay readable (golden tests, sampling) and the backward turns the same buffer into
// dlogits in one pass. Only columns [0, V) take part; padded columns are ignored forward
// and receive a zero gradient.
#pragma once

#include <cstdint>

namespace drover::engine::cpu {

// losses (N) = logsumexp(logits[n, :V]) - logits[n, targets[n]]; lse (N) saved for the
// backward. Returns the mean loss over the N = B*T rows (summed in double).
float CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V, int Vp);

// In place: logits (N, Vp) becomes dlogits = dloss * (softmax - onehot(target)) in
// columns [0, V) and 0 in [V, Vp). dloss is the gradient of each row's loss (for a mean
// over N rows scaled by s: s / N).
void CrossEntropyBackward(float* logits, const float* lse, const int32_t* targets, float dloss,
                          int N, int V, int Vp);

}  // namespace drover::engine::cpu
