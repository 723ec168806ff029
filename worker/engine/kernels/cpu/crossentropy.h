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
// over N rows scaled by s: s / N). A target of -1 has no one-hot (its column is another
// rank's).
void CrossEntropyBackward(float* logits, const float* lse, const int32_t* targets, float dloss,
                          int N, int V, int Vp);

// Over a vocabulary split (ops.h): lse (N) of columns [0, V) (-inf when V is 0) and
// target_logits (N) = logits[n, targets[n]], 0 for a target of -1.
void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                             const int32_t* targets, int N, int V, int Vp);

// lse (N) = log-sum-exp over the parts of lse_parts (parts, N); losses = lse -
// target_logits. Returns the mean loss (summed in double).
float CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                          const float* target_logits, int parts, int N);

}  // namespace drover::engine::cpu
