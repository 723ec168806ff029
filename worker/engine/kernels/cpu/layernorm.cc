#include "worker/engine/kernels/cpu/layernorm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "worker/engine/kernels/cpu/simd.h"

namespace drover::engine::cpu {
namespace {

DROVER_CPU_CLONES
void LayerNormRow(float* __restrict out, float* mean_out, float* rstd_out,
                  const float* __restrict x, const float* __restrict w, const float* __restrict b,
                  int C) {
  // Two passes (mean, then centred variance) for accuracy; the row stays in L1.
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; c++) sum += x[c];
  const float m = sum / C;
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int c = 0; c < C; c++) {
    const float d = x[c] - m;
    var += d * d;
  }
  const float s = 1.0f / std::sqrt(var / C + kLayerNormEps);
  for (int c = 0; c < C; c++) out[c] = (x[c] - m) * s * w[c] + b[c];
  *mean_out = m;
  *rstd_out = s;
}

DROVER_CPU_CLONES
void LayerNormBackwardRow(float* __restrict dx, float* __restrict dw_acc, float* __restrict db_acc,
                          const float* __restrict dy, const float* __restrict x,
                          const float* __restrict w, float m, float s, int C) {
  float dnorm_mean = 0.0f;
  float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
  for (int c = 0; c < C; c++) {
    const float norm = (x[c] - m) * s;
    const float dnorm = w[c] * dy[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean /= C;
  dnorm_norm_mean /= C;
  for (int c = 0; c < C; c++) {
    const float norm = (x[c] - m) * s;
    const float dnorm = w[c] * dy[c];
    db_acc[c] += dy[c];
    dw_acc[c] += norm * dy[c];
    dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

DROVER_CPU_CLONES
void AddInto(float* __restrict dst, const float* __restrict src, int n) {
  for (int i = 0; i < n; i++) dst[i] += src[i];
}

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const size_t row = static_cast<size_t>(n) * C;
    LayerNormRow(out + row, mean + n, rstd + n, inp + row, weight, bias, C);
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, bool accumulate) {
  // Each thread sums its rows' dweight/dbias in private buffers; the buffers are added in
  // thread order, so the result is deterministic for a given thread count.
  const int threads = omp_get_max_threads();
  static thread_local std::vector<float> partial;
  partial.assign(static_cast<size_t>(threads) * 2 * C, 0.0f);
  float* parts = partial.data();
#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num();
    float* dw = parts + static_cast<size_t>(tid) * 2 * C;
    float* db = dw + C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; n++) {
      const size_t row = static_cast<size_t>(n) * C;
      LayerNormBackwardRow(dinp + row, dw, db, dout + row, inp + row, weight, mean[n], rstd[n], C);
    }
  }
  if (!accumulate) {
    std::fill(dweight, dweight + C, 0.0f);
    std::fill(dbias, dbias + C, 0.0f);
  }
  for (int t = 0; t < threads; t++) {
    AddInto(dweight, parts + static_cast<size_t>(t) * 2 * C, C);
    AddInto(dbias, parts + static_cast<size_t>(t) * 2 * C + C, C);
  }
}

}  // namespace drover::engine::cpu
