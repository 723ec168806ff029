// Helpers that let the element-wise CPU kernels vectorise well without -march=native.
//
// DROVER_CPU_CLONES compiles a function for AVX-512, AVX2 and baseline x86-64 and picks
// one at load time (GCC target_clones / ifunc). Apply it to per-row helpers that OpenMP
// loops call, not to functions containing `#pragma omp parallel`: the outlined parallel
// body would not be cloned.
//
// ExpApprox is exp(x) for float, written without library calls or branches so that GCC
// vectorises loops that use it. Range reduction x = n ln2 + r with ln2 split in two, a
// degree-6 polynomial for exp(r) on |r| <= ln2/2, and 2^n built in the exponent bits.
// Relative error about 2e-7 for x in [-87, 88]; inputs are clamped to that range, so
// the result is never 0 or inf (exp(-87) ~ 1.6e-38), which is what softmax and tanh need.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__)
#define DROVER_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DROVER_CPU_CLONES
#endif

namespace drover::engine::cpu {

inline float ExpApprox(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick (no rounding call).
  const float kRound = 12582912.0f;
  float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh through exp: 1 - 2 / (exp(2x) + 1); saturates cleanly at +-1.
inline float TanhApprox(float x) { return 1.0f - 2.0f / (ExpApprox(2.0f * x) + 1.0f); }

}  // namespace drover::engine::cpu
