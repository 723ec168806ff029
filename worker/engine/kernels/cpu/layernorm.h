// LayerNorm over the last dimension, eps = 1e-5 (as GPT-2 / PyTorch).
#pragma once

namespace drover::engine::cpu {

inline constexpr float kLayerNormEps = 1e-5f;

// out (N, C) = (inp - mean) * rstd * weight (C) + bias (C); saves mean (N), rstd (N).
// N is B*T rows.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C);

// dinp (N, C) += d/dinp; dweight (C) += ...; dbias (C) += ... ; from dout (N, C) and the
// forward's inp, weight, mean, rstd. dinp ACCUMULATES: the residual stream's gradient
// arrives through both the skip connection and the LayerNorm. With accumulate == false,
// dweight and dbias are overwritten instead (dinp still accumulates).
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, bool accumulate = true);

}  // namespace drover::engine::cpu
