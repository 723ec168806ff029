// An output element as the run stores it (kernels/ops.h: `store`): rounded to bf16 or fp16
// and kept as a float, or as computed in fp32. The same rounding as the Round kernels
// (elementwise.cu, round to nearest even), done as the producing kernel writes the element
// rather than in a second pass over memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "worker/engine/kernels/precision.h"

namespace drover::engine::cuda {

__device__ __forceinline__ float Stored(float x, Precision store) {
  if (store == Precision::kBf16) return __bfloat162float(__float2bfloat16_rn(x));
  if (store == Precision::kFp16) return __half2float(__float2half_rn(x));
  return x;
}

}  // namespace drover::engine::cuda
