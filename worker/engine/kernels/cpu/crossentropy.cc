#include "worker/engine/kernels/cpu/crossentropy.h"

#include <algorithm>
#include <cmath>

#include "worker/engine/kernels/cpu/simd.h"

namespace drover::engine::cpu {
namespace {

DROVER_CPU_CLONES
float LogSumExp(const float* __restrict x, int V) {
  float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
  for (int i = 0; i < V; i++) maxv = x[i] > maxv ? x[i] : maxv;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < V; i++) sum += ExpApprox(x[i] - maxv);
  return maxv + std::log(sum);
}

DROVER_CPU_CLONES
void SoftmaxGradRow(float* __restrict x, float lse, float dloss, int V, int Vp) {
#pragma omp simd
  for (int i = 0; i < V; i++) x[i] = dloss * ExpApprox(x[i] - lse);
  for (int i = V; i < Vp; i++) x[i] = 0.0f;
}

}  // namespace

float CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                          int N, int V, int Vp) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; n++) {
    const float* row = logits + static_cast<size_t>(n) * Vp;
    lse[n] = LogSumExp(row, V);
    losses[n] = lse[n] - row[targets[n]];
    total += losses[n];
  }
  return static_cast<float>(total / N);
}

void CrossEntropyBackward(float* logits, const float* lse, const int32_t* targets, float dloss,
                          int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    float* row = logits + static_cast<size_t>(n) * Vp;
    SoftmaxGradRow(row, lse[n], dloss, V, Vp);
    if (targets[n] >= 0) row[targets[n]] -= dloss;
  }
}

void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                             const int32_t* targets, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const float* row = logits + static_cast<size_t>(n) * Vp;
    lse[n] = V > 0 ? LogSumExp(row, V) : -INFINITY;
    target_logits[n] = targets[n] >= 0 ? row[targets[n]] : 0.0f;
  }
}

float CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                          const float* target_logits, int parts, int N) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int n = 0; n < N; n++) {
    float maxv = -INFINITY;
    for (int p = 0; p < parts; p++)
      maxv = std::max(maxv, lse_parts[static_cast<size_t>(p) * N + n]);
    float sum = 0.0f;
    for (int p = 0; p < parts; p++)
      sum += std::exp(lse_parts[static_cast<size_t>(p) * N + n] - maxv);
    lse[n] = maxv + std::log(sum);
    losses[n] = lse[n] - target_logits[n];
    total += losses[n];
  }
  return static_cast<float>(total / N);
}

}  // namespace drover::engine::cpu
