// An output element as the run stores it (kernels/ops.h: `store`): rounded to bf16 or fp16
// and kept as a float, or as computed in fp32. The same rounding as the Round kernels
// (elementwise.cu, round to nearest even), done as the producing kernel writes the element
// rather than in a second pass over memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

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

// Eight 16-bit values of type N, loaded or stored as one 16-byte word (an operand buffer read
// 8 elements a load where it is 16-byte aligned). Copied from and to the word with memcpy,
// which compiles to register moves: reading a uint4 through an N pointer is undefined in
// C++ (the kernel emulator's compiler assumed the two never alias and lost the writes).
inline constexpr int kPerWord = 8;  // 16-bit values in a 16-byte word

// Whether p may be read and written in 16-byte words (host side, choosing a kernel).
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// An elementwise op over n elements in up to two launches: words(count) for the first
// count = n / kPerWord groups of kPerWord elements where `aligned` (every buffer 16-byte
// aligned: a kernel of 16-byte loads and stores), then rest(from) for the elements from `from`
// on (all of them where not aligned), each only where it has elements to do.
template <typename Words, typename Rest>
void InWordsThenRest(size_t n, bool aligned, Words words, Rest rest) {
  size_t from = 0;
  if (aligned && n >= kPerWord) {
    words(n / kPerWord);
    from = n / kPerWord * kPerWord;
  }
  if (from < n) rest(from);
}

template <typename N>
struct Word8 {
  N v[kPerWord];
  __device__ __forceinline__ static Word8 Load(const uint4* p) {
    const uint4 raw = *p;
    Word8 w;
    memcpy(&w, &raw, sizeof(raw));
    return w;
  }
  __device__ __forceinline__ void Store(uint4* p) const {
    uint4 raw;
    memcpy(&raw, this, sizeof(raw));
    *p = raw;
  }
};

// K floats at p, in 16-byte words where K is a multiple of 4 (p is then 16-byte aligned), and
// stored back so. A kernel that reads some memory through these reads and writes it only
// through them, as Word8 does (one type per access, so the compiler's aliasing holds).
template <int K>
__device__ __forceinline__ void LoadFloats(const float* p, float (&v)[K]) {
  if constexpr (K % 4 == 0) {
#pragma unroll
    for (int i = 0; i < K / 4; ++i) {
      const float4 w = reinterpret_cast<const float4*>(p)[i];
      v[4 * i] = w.x, v[4 * i + 1] = w.y, v[4 * i + 2] = w.z, v[4 * i + 3] = w.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = p[k];
  }
}
template <int K>
__device__ __forceinline__ void StoreFloats(float* p, const float (&v)[K]) {
  if constexpr (K % 4 == 0) {
#pragma unroll
    for (int i = 0; i < K / 4; ++i) {
      reinterpret_cast<float4*>(p)[i] = float4{v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]};
    }
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) p[k] = v[k];
  }
}

// An operand buffer (ops.h: Ops::OperandFloats) as a kernel writes it: 16-bit values of the
// run's precision where `narrow` (CUDA's mixed precision), else floats holding them. Offsets
// and indices count elements.
struct OperandOut {
  void* data;
  bool narrow;
  Precision precision;

  __device__ __forceinline__ void Put(size_t i, float x) const {
    if (!narrow) {
      static_cast<float*>(data)[i] = Stored(x, precision);
    } else if (precision == Precision::kBf16) {
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(x);
    } else {
      static_cast<__half*>(data)[i] = __float2half_rn(x);
    }
  }
  __host__ __device__ __forceinline__ OperandOut At(size_t offset) const {
    return {static_cast<char*>(data) + offset * (narrow ? 2 : 4), narrow, precision};
  }
};

// The same buffer as a kernel reads it: each element as the run stores it, so a float one is
// rounded as it is loaded (a GEMM may have written it unrounded: Ops::NarrowWritten).
struct OperandIn {
  const void* data;
  bool narrow;
  Precision precision;

  __device__ __forceinline__ float Get(size_t i) const {
    if (!narrow) return Stored(static_cast<const float*>(data)[i], precision);
    if (precision == Precision::kBf16) {
      return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
    }
    return __half2float(static_cast<const __half*>(data)[i]);
  }
  __host__ __device__ __forceinline__ OperandIn At(size_t offset) const {
    return {static_cast<const char*>(data) + offset * (narrow ? 2 : 4), narrow, precision};
  }
};

}  // namespace drover::engine::cuda
