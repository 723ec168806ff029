// Linear layer through BLAS sgemm, with the transposes expressed in the sgemm call so
// that no transposed copy is ever materialised.
#pragma once

namespace drover::engine::cpu {

// out (N, OC) = [residual (N, OC) +] inp (N, C) @ weight (OC, C)^T [+ bias (OC)].
// bias and residual may be null. ldo is out's (and residual's) row stride, normally OC
// (the LM head writes V of Vp columns). Folding the residual and bias into the sgemm's C
// operand (beta = 1) saves a separate pass over the output.
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                   const float* residual, int N, int C, int OC, int ldo);

// From dout (N, OC) (row stride ldo) and the forward's inp (N, C), weight (OC, C):
//   dinp (N, C) = dout @ weight          (OVERWRITTEN; skipped when dinp is null)
//   dweight (OC, C) += dout^T @ inp
//   dbias (OC) += column sums of dout     (skipped when dbias is null)
// With accumulate == false, dweight and dbias are overwritten (=) instead: the model's
// first backward after ZeroGrad uses this to skip zeroing and re-reading the gradients.
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC, int ldo, bool accumulate = true);

}  // namespace drover::engine::cpu
