// GELU, tanh approximation (kernels/cpu/gelu.h). inp and dout are read as values of `store`
// (the fc GEMM's output and input gradient, which Ops::NarrowWritten leaves unrounded on
// this table).
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCube = 0.044715f;

__global__ void GeluForwardKernel(float* out, const float* inp, size_t n, Precision store) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = Stored(inp[i], store);
    const float u = kSqrt2OverPi * (x + kCube * x * x * x);
    out[i] = Stored(0.5f * x * (1.0f + tanhf(u)), store);
  }
}

// In place allowed: dinp may be dout.
__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, size_t n,
                                   Precision store) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = Stored(inp[i], store);
    const float u = kSqrt2OverPi * (x + kCube * x * x * x);
    const float th = tanhf(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCube * x * x);
    dinp[i] = Stored(
        (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du) * Stored(dout[i], store), store);
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, size_t N, Precision store, cudaStream_t stream) {
  if (N == 0) return;
  DROVER_LAUNCH(GeluForwardKernel, StrideBlocks(N, kThreads), kThreads, 0, stream)
  (out, inp, N, store);
  DROVER_CUDA_LAUNCHED();
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N, Precision store,
                  cudaStream_t stream) {
  if (N == 0) return;
  DROVER_LAUNCH(GeluBackwardKernel, StrideBlocks(N, kThreads), kThreads, 0, stream)
  (dinp, inp, dout, N, store);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
