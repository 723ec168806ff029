// GELU, tanh approximation (kernels/cpu/gelu.h), on operand buffers (ops.h): 16-bit in a
// mixed-precision run, else floats, which are read as values of `store` (the fc GEMM's
// output and input gradient, which Ops::NarrowWritten leaves unrounded on this table).
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCube = 0.044715f;

__device__ __forceinline__ float GeluOf(float x) {
  const float u = kSqrt2OverPi * (x + kCube * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// d GELU(x) / dx.
__device__ __forceinline__ float GeluSlope(float x) {
  const float u = kSqrt2OverPi * (x + kCube * x * x * x);
  const float th = tanhf(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCube * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
}

// inp and out: operand buffers (ops.h).
__global__ void GeluForwardKernel(OperandOut out, OperandIn inp, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out.Put(i, GeluOf(inp.Get(i)));
  }
}

// Operand buffers all; in place allowed (dinp the memory of dout: each element is read
// before it is written).
__global__ void GeluBackwardKernel(OperandOut dinp, OperandIn inp, OperandIn dout, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    dinp.Put(i, GeluSlope(inp.Get(i)) * dout.Get(i));
  }
}

// The same on 16-bit operand buffers, 16 bytes (8 elements) a load and a store: the
// element-wise kernels above moved about a third of what the H200's memory can. GPT-2 124M
// at batch 32 on an H200: 4.0 ms of forward and 5.9 ms of backward a step with those, 1.35
// and 1.86 ms with these. The same arithmetic per element, so the same values. `words`
// counts 16-byte words; the caller does the tail.

template <typename N>
__global__ void GeluForwardWords(uint4* out, const uint4* inp, size_t words) {
  for (size_t w = blockIdx.x * size_t{blockDim.x} + threadIdx.x; w < words;
       w += size_t{gridDim.x} * blockDim.x) {
    const Word8<N> x = Word8<N>::Load(inp + w);
    Word8<N> y;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) y.v[k] = ToNarrow<N>(GeluOf(ToFloat(x.v[k])));
    y.Store(out + w);
  }
}

template <typename N>
__global__ void GeluBackwardWords(uint4* dinp, const uint4* inp, const uint4* dout, size_t words) {
  for (size_t w = blockIdx.x * size_t{blockDim.x} + threadIdx.x; w < words;
       w += size_t{gridDim.x} * blockDim.x) {
    const Word8<N> x = Word8<N>::Load(inp + w), g = Word8<N>::Load(dout + w);
    Word8<N> d;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      d.v[k] = ToNarrow<N>(GeluSlope(ToFloat(x.v[k])) * ToFloat(g.v[k]));
    }
    d.Store(dinp + w);
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, size_t N, Precision store, bool narrow_out,
                 cudaStream_t stream) {
  if (N == 0) return;
  DROVER_CUDA_REQUIRE(!narrow_out || store != Precision::kFp32);
  InWordsThenRest(
      N, narrow_out && Aligned16(out) && Aligned16(inp),
      [&](size_t words) {
        auto* o = reinterpret_cast<uint4*>(out);
        const auto* x = reinterpret_cast<const uint4*>(inp);
        if (store == Precision::kBf16) {
          DROVER_LAUNCH(GeluForwardWords<__nv_bfloat16>, StrideBlocks(words, kThreads), kThreads, 0,
                        stream)
          (o, x, words);
        } else {
          DROVER_LAUNCH(GeluForwardWords<__half>, StrideBlocks(words, kThreads), kThreads, 0,
                        stream)
          (o, x, words);
        }
        DROVER_CUDA_LAUNCHED();
      },
      [&](size_t from) {
        DROVER_LAUNCH(GeluForwardKernel, StrideBlocks(N - from, kThreads), kThreads, 0, stream)
        (OperandOut{out, narrow_out, store}.At(from), OperandIn{inp, narrow_out, store}.At(from),
         N - from);
        DROVER_CUDA_LAUNCHED();
      });
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N, Precision store,
                  bool narrow_out, cudaStream_t stream) {
  if (N == 0) return;
  DROVER_CUDA_REQUIRE(!narrow_out || store != Precision::kFp32);
  InWordsThenRest(
      N, narrow_out && Aligned16(dinp) && Aligned16(inp) && Aligned16(dout),
      [&](size_t words) {
        auto* d = reinterpret_cast<uint4*>(dinp);
        const auto* x = reinterpret_cast<const uint4*>(inp);
        const auto* g = reinterpret_cast<const uint4*>(dout);
        if (store == Precision::kBf16) {
          DROVER_LAUNCH(GeluBackwardWords<__nv_bfloat16>, StrideBlocks(words, kThreads), kThreads,
                        0, stream)
          (d, x, g, words);
        } else {
          DROVER_LAUNCH(GeluBackwardWords<__half>, StrideBlocks(words, kThreads), kThreads, 0,
                        stream)
          (d, x, g, words);
        }
        DROVER_CUDA_LAUNCHED();
      },
      [&](size_t from) {
        DROVER_LAUNCH(GeluBackwardKernel, StrideBlocks(N - from, kThreads), kThreads, 0, stream)
        (OperandOut{dinp, narrow_out, store}.At(from), OperandIn{inp, narrow_out, store}.At(from),
         OperandIn{dout, narrow_out, store}.At(from), N - from);
        DROVER_CUDA_LAUNCHED();
      });
}

}  // namespace drover::engine::cuda
