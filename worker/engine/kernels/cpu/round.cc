#include "worker/engine/kernels/cpu/round.h"

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

}  // namespace

void RoundToBf16(float* x, size_t n) {
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) x[i] = Bf16(x[i]);
}

void RoundToFp16(float* x, size_t n) {
  const auto count = static_cast<int64_t>(n);
  // The conversion to _Float16 rounds to nearest even and overflows to inf (IEEE 754).
#pragma omp parallel for schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(static_cast<_Float16>(x[i]));
}

}  // namespace drover::engine::cpu
