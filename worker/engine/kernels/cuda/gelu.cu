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

// out: an operand buffer (ops.h).
__global__ void GeluForwardKernel(OperandOut out, const float* inp, size_t n) {
  const Precision store = out.precision;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = Stored(inp[i], store);
    const float u = kSqrt2OverPi * (x + kCube * x * x * x);
    out.Put(i, 0.5f * x * (1.0f + tanhf(u)));
  }
}

// dinp: an operand buffer; in place (dinp the memory of dout) only where it holds floats,
// each element read before it is written.
__global__ void GeluBackwardKernel(OperandOut dinp, const float* inp, const float* dout, size_t n) {
  const Precision store = dinp.precision;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = Stored(inp[i], store);
    const float u = kSqrt2OverPi * (x + kCube * x * x * x);
    const float th = tanhf(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCube * x * x);
    dinp.Put(i, (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du) * Stored(dout[i], store));
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, size_t N, Precision store, bool narrow_out,
                 cudaStream_t stream) {
  if (N == 0) return;
  DROVER_CUDA_REQUIRE(!narrow_out || store != Precision::kFp32);
  DROVER_LAUNCH(GeluForwardKernel, StrideBlocks(N, kThreads), kThreads, 0, stream)
  (OperandOut{out, narrow_out, store}, inp, N);
  DROVER_CUDA_LAUNCHED();
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N, Precision store,
                  bool narrow_out, cudaStream_t stream) {
  if (N == 0) return;
  DROVER_CUDA_REQUIRE(!narrow_out || (store != Precision::kFp32 && dinp != dout));
  DROVER_LAUNCH(GeluBackwardKernel, StrideBlocks(N, kThreads), kThreads, 0, stream)
  (OperandOut{dinp, narrow_out, store}, inp, dout, N);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
