// Fill, Add, Scale, Round, NarrowCopy, WidenCopy and SumSquares over flat arrays.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;
// SumSquares: at most this many blocks in the first pass, each leaving one partial sum, and
// at least kSumPerThread elements a thread: a grid of 1024 blocks over a small array (a
// tensor-parallel shard, a test's model) left most of its threads with nothing to add. The
// grid depends on n alone, so a sum is the same on every run.
constexpr unsigned kSumBlocks = 1024;
constexpr size_t kSumPerThread = 8;

__global__ void FillKernel(float* x, float value, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = value;
  }
}

__global__ void AddKernel(float* y, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    y[i] += x[i];
  }
}

__global__ void ScaleKernel(float* x, size_t n, float s) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] *= s;
  }
}

// out = x rounded to N, as floats (out may be x: in place).
template <typename N>
__global__ void RoundKernel(float* out, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = ToFloat(ToNarrow<N>(x[i]));
  }
}

// The same 8 floats a thread, in two 16-byte loads and stores (the residual stream's
// rounding, before it stayed fp32, took 2.1 ms of an H200's GPT-2 124M step with 4-byte
// accesses; Round now serves the narrowed parameters and the fp32-input GEMM runs).
// `words` counts 8-float groups; the caller does the tail.
template <typename N>
__global__ void RoundWords(float* out, const float* x, size_t words) {
  for (size_t w = blockIdx.x * size_t{blockDim.x} + threadIdx.x; w < words;
       w += size_t{gridDim.x} * blockDim.x) {
    float v[kPerWord];
    LoadFloats<kPerWord>(x + w * kPerWord, v);
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) v[k] = ToFloat(ToNarrow<N>(v[k]));
    StoreFloats<kPerWord>(out + w * kPerWord, v);
  }
}

template <typename N>
__global__ void NarrowCopyKernel(N* out, const float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = ToNarrow<N>(x[i]);
  }
}

// The same 8 elements a thread: two 16-byte loads and one 16-byte store (the kernel above
// stores 2 bytes a thread). `words` counts 16-byte words of out; the caller does the tail.
template <typename N>
__global__ void NarrowCopyWords(uint4* out, const float* x, size_t words) {
  for (size_t w = blockIdx.x * size_t{blockDim.x} + threadIdx.x; w < words;
       w += size_t{gridDim.x} * blockDim.x) {
    float v[kPerWord];
    LoadFloats<kPerWord>(x + w * kPerWord, v);
    Word8<N> y;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) y.v[k] = ToNarrow<N>(v[k]);
    y.Store(out + w);
  }
}

template <typename N>
__global__ void WidenCopyKernel(float* out, const N* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = ToFloat(x[i]);
  }
}

// Sums a block's values in a fixed tree order (deterministic for a given launch shape).
__device__ double BlockSum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  return shared[0];
}

// Pass 1: block b sums the squares of its grid-stride elements into partial[b].
__global__ void SumSquaresPartial(const float* x, size_t n, double* partial) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  const double total = BlockSum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// Pass 2: one block sums the `count` partials into partial[kSumBlocks].
__global__ void SumSquaresFinal(double* partial, unsigned count) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  const double total = BlockSum(acc, shared);
  if (threadIdx.x == 0) partial[kSumBlocks] = total;
}

// Round for one 16-bit type: 8 floats a thread where both are 16-byte aligned, then the rest.
template <typename N>
void RoundAs(float* out, const float* x, size_t n, cudaStream_t stream) {
  InWordsThenRest(
      n, Aligned16(out) && Aligned16(x),
      [&](size_t words) {
        DROVER_LAUNCH(RoundWords<N>, StrideBlocks(words, kThreads), kThreads, 0, stream)
        (out, x, words);
        DROVER_CUDA_LAUNCHED();
      },
      [&](size_t from) {
        DROVER_LAUNCH(RoundKernel<N>, StrideBlocks(n - from, kThreads), kThreads, 0, stream)
        (out + from, x + from, n - from);
        DROVER_CUDA_LAUNCHED();
      });
}

// NarrowCopy for one 16-bit type: 8 elements a thread where both buffers are 16-byte
// aligned, then the rest.
template <typename N>
void NarrowCopyAs(N* out, const float* x, size_t n, cudaStream_t stream) {
  InWordsThenRest(
      n, Aligned16(out) && Aligned16(x),
      [&](size_t words) {
        DROVER_LAUNCH(NarrowCopyWords<N>, StrideBlocks(words, kThreads), kThreads, 0, stream)
        (reinterpret_cast<uint4*>(out), x, words);
        DROVER_CUDA_LAUNCHED();
      },
      [&](size_t from) {
        DROVER_LAUNCH(NarrowCopyKernel<N>, StrideBlocks(n - from, kThreads), kThreads, 0, stream)
        (out + from, x + from, n - from);
        DROVER_CUDA_LAUNCHED();
      });
}

}  // namespace

void Fill(float* x, float value, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (value == 0.0f) {
    DROVER_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream));
    return;
  }
  DROVER_LAUNCH(FillKernel, StrideBlocks(n, kThreads), kThreads, 0, stream)(x, value, n);
  DROVER_CUDA_LAUNCHED();
}

void Add(float* y, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  DROVER_LAUNCH(AddKernel, StrideBlocks(n, kThreads), kThreads, 0, stream)(y, x, n);
  DROVER_CUDA_LAUNCHED();
}

void Scale(float* x, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  DROVER_LAUNCH(ScaleKernel, StrideBlocks(n, kThreads), kThreads, 0, stream)(x, n, s);
  DROVER_CUDA_LAUNCHED();
}

void Round(float* out, const float* x, size_t n, int precision, cudaStream_t stream) {
  if (n == 0) return;
  DROVER_CUDA_REQUIRE(precision == 1 || precision == 2);
  DROVER_CUDA_REQUIRE(out == x || out + n <= x || x + n <= out);
  if (precision == 1) {
    RoundAs<__nv_bfloat16>(out, x, n, stream);
  } else {
    RoundAs<__half>(out, x, n, stream);
  }
}

void NarrowCopy(void* out, const float* x, size_t n, Precision p, cudaStream_t stream) {
  if (n == 0) return;
  DROVER_CUDA_REQUIRE(p == Precision::kBf16 || p == Precision::kFp16);
  if (p == Precision::kBf16) {
    NarrowCopyAs(static_cast<__nv_bfloat16*>(out), x, n, stream);
  } else {
    NarrowCopyAs(static_cast<__half*>(out), x, n, stream);
  }
}

void WidenCopy(float* out, const void* x, size_t n, Precision p, cudaStream_t stream) {
  if (n == 0) return;
  DROVER_CUDA_REQUIRE(p == Precision::kBf16 || p == Precision::kFp16);
  if (p == Precision::kBf16) {
    DROVER_LAUNCH(WidenCopyKernel<__nv_bfloat16>, StrideBlocks(n, kThreads), kThreads, 0, stream)
    (out, static_cast<const __nv_bfloat16*>(x), n);
  } else {
    DROVER_LAUNCH(WidenCopyKernel<__half>, StrideBlocks(n, kThreads), kThreads, 0, stream)
    (out, static_cast<const __half*>(x), n);
  }
  DROVER_CUDA_LAUNCHED();
}

size_t SumSquaresScratch() { return kSumBlocks + 1; }

double SumSquares(const float* x, size_t n, double* scratch, cudaStream_t stream) {
  if (n == 0) return 0.0;
  const size_t per_block = kThreads * kSumPerThread;
  const auto blocks =
      static_cast<unsigned>(std::min<size_t>(kSumBlocks, (n + per_block - 1) / per_block));
  DROVER_LAUNCH(SumSquaresPartial, blocks, kThreads, 0, stream)(x, n, scratch);
  DROVER_CUDA_LAUNCHED();
  DROVER_LAUNCH(SumSquaresFinal, 1, kThreads, 0, stream)(scratch, blocks);
  DROVER_CUDA_LAUNCHED();
  double total = 0;
  DROVER_CUDA_CHECK(cudaMemcpyAsync(&total, scratch + kSumBlocks, sizeof(double),
                                    cudaMemcpyDeviceToHost, stream));
  DROVER_CUDA_CHECK(cudaStreamSynchronize(stream));
  return total;
}

}  // namespace drover::engine::cuda
