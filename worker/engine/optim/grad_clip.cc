#include "worker/engine/optim/grad_clip.h"

#include <cmath>
#include <cstdint>

namespace drover::engine {
namespace {

// Below this many elements an OpenMP parallel region costs more than it saves.
constexpr int64_t kParallelThreshold = int64_t{1} << 15;

}  // namespace

double SumSquares(const float* x, size_t n) {
  double sum = 0;
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for simd reduction(+ : sum) schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) {
    const double xi = x[i];
    sum += xi * xi;
  }
  return sum;
}

double GlobalNorm(const float* x, size_t n) { return std::sqrt(SumSquares(x, n)); }

double ClipScale(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

void ScaleInPlace(float* x, size_t n, float scale) {
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) x[i] *= scale;
}

double ClipGradNorm(float* grads, size_t n, double max_norm) {
  const double norm = GlobalNorm(grads, n);
  const double scale = ClipScale(norm, max_norm);
  if (scale != 1.0) ScaleInPlace(grads, n, static_cast<float>(scale));
  return norm;
}

}  // namespace drover::engine
