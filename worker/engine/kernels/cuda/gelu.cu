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

// inp and out: operand buffers (ops.h).
__global__ void GeluForwardKernel(OperandOut out, OperandIn inp, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = inp.Get(i);
    const float u = kSqrt2OverPi * (x + kCube * x * x * x);
    out.Put(i, 0.5f * x * (1.0f + tanhf(u)));
  }
}

// Operand buffers all; in place allowed (dinp the memory of dout: each element is read
// before it is written).
__global__ void GeluBackwardKernel(OperandOut dinp, OperandIn inp, OperandIn dout, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float x = inp.Get(i);
    const float u = kSqrt2OverPi * (x + kCube * x * x * x);
    const float th = tanhf(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCube * x * x);
    dinp.Put(i, (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du) * dout.Get(i));
  }
}

}  // namespace

void GeluForward(float* out, const float* inp, size_t N, Precision store, bool narrow_out,
                 cudaStream_t stream) {
  if (N == 0) return;
  DROVER_CUDA_REQUIRE(!narrow_out || store != Precision::kFp32);
  DROVER_LAUNCH(GeluForwardKernel, StrideBlocks(N, kThreads), kThreads, 0, stream)
  (OperandOut{out, narrow_out, store}, OperandIn{inp, narrow_out, store}, N);
  DROVER_CUDA_LAUNCHED();
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N, Precision store,
                  bool narrow_out, cudaStream_t stream) {
  if (N == 0) return;
  DROVER_CUDA_REQUIRE(!narrow_out || store != Precision::kFp32);
  DROVER_LAUNCH(GeluBackwardKernel, StrideBlocks(N, kThreads), kThreads, 0, stream)
  (OperandOut{dinp, narrow_out, store}, OperandIn{inp, narrow_out, store},
   OperandIn{dout, narrow_out, store}, N);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
