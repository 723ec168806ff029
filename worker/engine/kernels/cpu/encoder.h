// Token + position embedding.
#pragma once

#include <cstdint>

namespace drover::engine::cpu {

// out (B, T, C) = wte[inp[b, t]] (Vp, C) + wpe[t] (maxT, C).
void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C);

// dwte (Vp, C) += scatter of dout (B, T, C) by inp (B, T); dwpe (maxT, C) += sum over b.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                     int C);

}  // namespace drover::engine::cpu
