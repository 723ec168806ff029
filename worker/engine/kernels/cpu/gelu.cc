#include "worker/engine/kernels/cpu/gelu.h"

#include <algorithm>

#include "worker/engine/kernels/cpu/simd.h"

namespace drover::engine::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCube = 0.044715f;
constexpr size_t kChunk = 4096;  // elements per task: big enough to amortise dispatch

DROVER_CPU_CLONES
void GeluChunk(float* __restrict out, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const float u = kSqrt2OverPi * (x[i] + kCube * x[i] * x[i] * x[i]);
    out[i] = 0.5f * x[i] * (1.0f + TanhApprox(u));
  }
}

// No __restrict on d/dx: the backward may run in place.
DROVER_CPU_CLONES
void GeluBackwardChunk(float* dx, const float* __restrict x, const float* d, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kCube * xi * xi * xi);
    const float th = TanhApprox(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCube * xi * xi);
    const float grad = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
    dx[i] = grad * d[i];
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, size_t N) {
  const size_t chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; c++) {
    const size_t i0 = c * kChunk;
    GeluChunk(out + i0, inp + i0, std::min(kChunk, N - i0));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N) {
  const size_t chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; c++) {
    const size_t i0 = c * kChunk;
    GeluBackwardChunk(dinp + i0, inp + i0, dout + i0, std::min(kChunk, N - i0));
  }
}

}  // namespace drover::engine::cpu
