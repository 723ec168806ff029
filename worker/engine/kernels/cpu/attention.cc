#include "worker/engine/kernels/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "worker/engine/kernels/cpu/simd.h"

namespace drover::engine::cpu {
namespace {

// Row t of one (b, h) slice: a[0..t] = softmax(q_t . k_t2 * scale), o = sum a[t2] v_t2. Rows
// of k and v are `stride` floats apart. Inlined into the clones below, so that the forward and
// the decoder form a row's values in the same operations.
__attribute__((always_inline)) inline void AttentionRow(float* __restrict o, float* __restrict a,
                                                        const float* __restrict qt,
                                                        const float* __restrict k,
                                                        const float* __restrict v, int t, int HS,
                                                        int stride, float scale) {
  float maxv = -INFINITY;
  for (int t2 = 0; t2 <= t; t2++) {
    const float* kt = k + static_cast<size_t>(t2) * stride;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < HS; i++) dot += qt[i] * kt[i];
    dot *= scale;
    a[t2] = dot;
    maxv = dot > maxv ? dot : maxv;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int t2 = 0; t2 <= t; t2++) {
    const float e = ExpApprox(a[t2] - maxv);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int t2 = 0; t2 <= t; t2++) a[t2] *= inv;
  for (int i = 0; i < HS; i++) o[i] = 0.0f;
  for (int t2 = 0; t2 <= t; t2++) {
    const float* vt = v + static_cast<size_t>(t2) * stride;
    const float w = a[t2];
    for (int i = 0; i < HS; i++) o[i] += w * vt[i];
  }
}

// One (b, h) slice: rows t of q, k, v and out are `stride` floats apart.
DROVER_CPU_CLONES
void AttentionHeadForward(float* __restrict out, float* __restrict att, const float* __restrict q,
                          const float* __restrict k, const float* __restrict v, int T, int HS,
                          int stride, int ostride, float scale) {
  for (int t = 0; t < T; t++) {
    float* a = att + static_cast<size_t>(t) * T;
    AttentionRow(out + static_cast<size_t>(t) * ostride, a, q + static_cast<size_t>(t) * stride, k,
                 v, t, HS, stride, scale);
    for (int t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
  }
}

// Rows from..from+rows-1 of one head's slice, the probabilities in `a` (from + rows floats).
DROVER_CPU_CLONES
void AttentionHeadDecode(float* __restrict out, float* __restrict a, const float* __restrict q,
                         const float* __restrict k, const float* __restrict v, int from, int rows,
                         int HS, int stride, int ostride, float scale) {
  for (int i = 0; i < rows; i++) {
    const int t = from + i;
    AttentionRow(out + static_cast<size_t>(i) * ostride, a, q + static_cast<size_t>(t) * stride, k,
                 v, t, HS, stride, scale);
  }
}

DROVER_CPU_CLONES
void AttentionHeadBackward(float* __restrict dq, float* __restrict dk, float* __restrict dv,
                           float* __restrict datt, const float* __restrict dout,
                           const float* __restrict att, const float* __restrict q,
                           const float* __restrict k, const float* __restrict v, int T, int HS,
                           int dstride, int stride, int ostride, float scale) {
  for (int t = 0; t < T; t++) {
    float* dqt = dq + static_cast<size_t>(t) * dstride;
    for (int i = 0; i < HS; i++) dqt[i] = 0.0f;
    float* dkt = dk + static_cast<size_t>(t) * dstride;
    for (int i = 0; i < HS; i++) dkt[i] = 0.0f;
    float* dvt = dv + static_cast<size_t>(t) * dstride;
    for (int i = 0; i < HS; i++) dvt[i] = 0.0f;
  }
  for (int t = 0; t < T; t++) {
    const float* a = att + static_cast<size_t>(t) * T;
    const float* dot = dout + static_cast<size_t>(t) * ostride;
    const float* qt = q + static_cast<size_t>(t) * stride;
    float* dqt = dq + static_cast<size_t>(t) * dstride;
    // datt[t2] = dout_t . v_t2; dv_t2 += att[t2] dout_t.
    float weighted = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) {
      const float* vt = v + static_cast<size_t>(t2) * stride;
      float* dvt = dv + static_cast<size_t>(t2) * dstride;
      float d = 0.0f;
      const float w = a[t2];
#pragma omp simd reduction(+ : d)
      for (int i = 0; i < HS; i++) {
        d += dot[i] * vt[i];
        dvt[i] += w * dot[i];
      }
      datt[t2] = d;
      weighted += w * d;
    }
    // Softmax backward, then through the scaled dot product.
    for (int t2 = 0; t2 <= t; t2++) {
      const float dpre = a[t2] * (datt[t2] - weighted) * scale;
      const float* kt = k + static_cast<size_t>(t2) * stride;
      float* dkt = dk + static_cast<size_t>(t2) * dstride;
      for (int i = 0; i < HS; i++) {
        dqt[i] += dpre * kt[i];
        dkt[i] += dpre * qt[i];
      }
    }
  }
}

}  // namespace

void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int stride = 3 * C;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float* base = qkv + static_cast<size_t>(b) * T * stride + h * HS;
      float* o = out + static_cast<size_t>(b) * T * C + h * HS;
      float* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      AttentionHeadForward(o, a, base, base + C, base + 2 * C, T, HS, stride, C, scale);
    }
  }
}

void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int stride = 3 * C;
  // Heads in parallel; a single query (the usual decoder step) has nothing else to split.
#pragma omp parallel
  {
    std::vector<float> a(static_cast<size_t>(from) + rows);
#pragma omp for schedule(static)
    for (int h = 0; h < NH; h++) {
      const float* base = qkv + h * HS;
      AttentionHeadDecode(out + h * HS, a.data(), base, base + C, base + 2 * C, from, rows, HS,
                          stride, C, scale);
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* att, const float* qkv, int B,
                       int T, int C, int NH) {
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int stride = 3 * C;
#pragma omp parallel
  {
    static thread_local std::vector<float> datt;
    datt.resize(T);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        const size_t off = static_cast<size_t>(b) * T * stride + h * HS;
        AttentionHeadBackward(dqkv + off, dqkv + off + C, dqkv + off + 2 * C, datt.data(),
                              dout + static_cast<size_t>(b) * T * C + h * HS,
                              att + (static_cast<size_t>(b) * NH + h) * T * T, qkv + off,
                              qkv + off + C, qkv + off + 2 * C, T, HS, stride, stride, C, scale);
      }
    }
  }
}

}  // namespace drover::engine::cpu
