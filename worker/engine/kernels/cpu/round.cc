#include "worker/engine/kernels/cpu/round.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace drover::engine::cpu {
namespace {

constexpr int64_t kParallelThreshold = int64_t{1} << 15;

inline float Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;  // NaN: rounding could make it inf
  // Round to nearest, ties to even, on the 16 bits that go: add half an ulp of bf16 minus
  // one, plus the lowest kept bit, and cut.
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

// The nearest fp16 value to f (ties to even) as a float, as a store to fp16 and a load back
// give it: above the largest finite (65504) by half an ulp or more, inf; below fp16's
// normal range (2^-14), a multiple of its subnormal step 2^-24; NaN stays NaN. Bits, not
// _Float16, which not every compiler has on x86 (clang 14, the fuzz build's, lacks it).
inline float Fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = u & 0x80000000u, abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return f;  // inf, NaN
  if (abs >= 0x477ff000u) {          // 65520: the tie between 65504 and 2^16, to even
    u = sign | 0x7f800000u;
  } else if (abs < 0x38800000u) {  // below 2^-14
    float a;
    std::memcpy(&a, &abs, 4);
    // a * 2^24 is exact, and nearbyint rounds it to an integer ties-to-even (the default
    // rounding mode), which is the number of 2^-24 steps the subnormal holds.
    a = std::nearbyint(a * 0x1p24f) * 0x1p-24f;
    std::memcpy(&u, &a, 4);
    u |= sign;
  } else {
    // Keep 10 of the 23 fraction bits: add half an ulp of fp16 minus one, plus the lowest
    // kept bit, and cut (a carry into the exponent is the right result).
    u = sign | ((abs + 0xfffu + ((abs >> 13) & 1u)) & ~0x1fffu);
  }
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void RoundToBf16(float* x, size_t n) {
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) x[i] = Bf16(x[i]);
}

void RoundToFp16(float* x, size_t n) {
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) x[i] = Fp16(x[i]);
}

}  // namespace drover::engine::cpu
