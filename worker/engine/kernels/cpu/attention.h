// Causal multi-head self-attention over a packed qkv tensor, scale + mask + softmax fused.
//
// qkv (B, T, 3C) holds q, k, v side by side; head h uses channels [h*HS, (h+1)*HS) of each,
// HS = C / NH. The only (B, NH, T, T) buffer is att, the softmax probabilities, which the
// backward pass needs; entries above the diagonal are written as zero.
#pragma once

namespace drover::engine::cpu {

// out (B, T, C), att (B, NH, T, T) from qkv (B, T, 3C).
void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);

// out (rows, C): rows from..from+rows-1 of AttentionForward's out for the one sequence qkv
// (from + rows, 3C), the same values, without the rows before them (ops.h: AttentionDecode).
void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH);

// dqkv (B, T, 3C) OVERWRITTEN from dout (B, T, C) and the forward's att, qkv.
void AttentionBackward(float* dqkv, const float* dout, const float* att, const float* qkv, int B,
                       int T, int C, int NH);

}  // namespace drover::engine::cpu
