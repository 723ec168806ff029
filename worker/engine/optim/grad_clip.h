// Global-norm gradient clipping and the small helpers around it.
//
// Norms accumulate in double, so the result does not depend on the summation order enough
// to matter between single-process and sharded runs (which add per-shard sums of squares).
#pragma once

#include <cstddef>

namespace drover::engine {

// Sum of squares of n floats, in double. Sharded runs all-reduce this and take sqrt.
double SumSquares(const float* x, size_t n);

// sqrt(SumSquares(x, n)).
double GlobalNorm(const float* x, size_t n);

// The factor by which to multiply gradients of global norm `norm` to clip them to
// `max_norm` (PyTorch's clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1). Returns 1
// when max_norm <= 0 (clipping disabled) or the norm is not above max_norm.
double ClipScale(double norm, double max_norm);

// x[i] *= scale for n floats. For clipping, and for gradient accumulation (1 / accum_steps).
void ScaleInPlace(float* x, size_t n, float scale);

// Computes the global norm of grads[0..n), clips it to max_norm in place (see ClipScale)
// and returns the norm before clipping.
double ClipGradNorm(float* grads, size_t n, double max_norm);

}  // namespace drover::engine
