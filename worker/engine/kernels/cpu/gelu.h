// GELU, tanh approximation (as GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include <cstddef>

namespace drover::engine::cpu {

// out (N) = gelu(inp (N)).
void GeluForward(float* out, const float* inp, size_t N);

// dinp (N) = gelu'(inp) * dout (N). OVERWRITTEN; dinp may alias dout (in place).
void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N);

}  // namespace drover::engine::cpu
