// Token + position embedding.
#pragma once

#include <cstddef>
#include <cstdint>

namespace drover::engine::cpu {

// out (B, T, C) = wte[inp[b, t]] (Vp, C) + wpe[t] (maxT, C). An id of -1 (a token another
// rank holds, ops.h) gives a zero row; in the backwards it adds no dwte row, but its
// position gets its gradient.
void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C);

// dwte (Vp, C) += scatter of dout (B, T, C) by inp (B, T); dwpe (maxT, C) += sum over b.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                     int C);

// The same sums, into the window [lo, hi) of the embedding's gradient laid out as
// [dwte (Vp, C) | dwpe (maxT, C)] with dwpe at element wpe_offset: `dwindow` is element lo,
// and nothing outside the window is read or written. For a shard of the gradient (ZeRO)
// receiving the embedding's rows after the dense part was reduced.
void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                           const float* dout, const int32_t* inp, int B, int T, int C);

}  // namespace drover::engine::cpu
