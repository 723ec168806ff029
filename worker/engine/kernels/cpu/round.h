// Narrowing to a storage precision on the CPU: each fp32 value becomes the nearest value of
// the narrower type (ties to even), as a store to it and a load back would leave it, kept in
// fp32. The CPU path emulates bf16 / fp16 storage this way at every op boundary while its
// kernels accumulate in fp32 (as tensor cores do), so mixed-precision training (the
// compute copy of the weights, the loss scaler, overflow skips) runs and is tested on
// machines without a GPU. It saves no memory; it reproduces the numbers.
#pragma once

#include <cstddef>

namespace drover::engine::cpu {

// x (n) rounded to bf16 in place. NaN stays NaN; values past bf16's largest finite round
// to +-inf, as fp32 ones do.
void RoundToBf16(float* x, size_t n);

// x (n) rounded to fp16 in place: |x| >= 65520 becomes +-inf (what a store overflows to),
// small values become fp16 subnormals or zero.
void RoundToFp16(float* x, size_t n);

}  // namespace drover::engine::cpu
