// An output element as the run stores it (kernels/ops.h: `store`): rounded to bf16 or fp16
// and kept as a float, or as computed in fp32. The same rounding as the Round kernels
// (elementwise.cu, round to nearest even), done as the producing kernel writes the element
// rather than in a second pass over memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "worker/engine/kernels/precision.h"

namespace drover::engine::cuda {

// A value in a 16-bit format N (__nv_bfloat16 or __half), round to nearest even, and back.
template <typename N>
__device__ __forceinline__ N ToNarrow(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 ToNarrow<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half ToNarrow<__half>(float x) {
  return __float2half_rn(x);
}
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

__device__ __forceinline__ float Stored(float x, Precision store) {
  if (store == Precision::kBf16) return __bfloat162float(__float2bfloat16_rn(x));
  if (store == Precision::kFp16) return __half2float(__float2half_rn(x));
  return x;
}

}  // namespace drover::engine::cuda
