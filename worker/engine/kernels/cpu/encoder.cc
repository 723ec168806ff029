#include "worker/engine/kernels/cpu/encoder.h"

#include <algorithm>

namespace drover::engine::cpu {

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      float* __restrict o = out + (static_cast<size_t>(b) * T + t) * C;
      const int32_t id = inp[b * T + t];
      if (id < 0) {  // another rank's row (a vocabulary split)
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        continue;
      }
      const float* __restrict we = wte + static_cast<size_t>(id) * C;
      const float* __restrict pe = wpe + static_cast<size_t>(t) * C;
      for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
  }
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                     int C) {
  // Repeated tokens scatter into the same dwte row, so threads split the channels rather
  // than the rows: every thread owns a column block of dwte and dwpe, and the result does
  // not depend on the thread count.
  constexpr int kBlock = 64;
  const int blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * kBlock;
    const int c1 = std::min(C, c0 + kBlock);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const float* __restrict d = dout + (static_cast<size_t>(b) * T + t) * C;
        float* __restrict pe = dwpe + static_cast<size_t>(t) * C;
        for (int c = c0; c < c1; c++) pe[c] += d[c];
        const int32_t id = inp[b * T + t];
        if (id < 0) continue;  // another rank's row
        float* __restrict we = dwte + static_cast<size_t>(id) * C;
        for (int c = c0; c < c1; c++) we[c] += d[c];
      }
    }
  }
}

void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                           const float* dout, const int32_t* inp, int B, int T, int C) {
  // Threads own column blocks, as in EncoderBackward; each row is clipped to the window.
  constexpr int kBlock = 64;
  const int blocks = (C + kBlock - 1) / kBlock;
  auto add_row = [&](size_t row, const float* __restrict d, int c0, int c1) {
    // Columns [c0, c1) of the row starting at element `row`, within [lo, hi).
    const size_t b = std::max(row + c0, lo), e = std::min(row + c1, hi);
    for (size_t i = b; i < e; i++) dwindow[i - lo] += d[i - row];
  };
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * kBlock;
    const int c1 = std::min(C, c0 + kBlock);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) {
        const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
        const int32_t id = inp[b * T + t];
        if (id >= 0) add_row(static_cast<size_t>(id) * C, d, c0, c1);
        add_row(wpe_offset + static_cast<size_t>(t) * C, d, c0, c1);
      }
    }
  }
}

}  // namespace drover::engine::cpu
