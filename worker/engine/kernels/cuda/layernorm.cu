// LayerNorm over the last dimension, eps 1e-5 (kernels/cpu/layernorm.h). One warp per row
// for the row-wise work; the weight and bias gradients are deterministic column sums over
// every row (column_sum.cuh). The backward reads dout as a value of `store` (a GEMM's input
// gradient, which Ops::NarrowWritten leaves unrounded on this table).
#include "worker/engine/kernels/cuda/column_sum.cuh"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr unsigned kWarpsPerBlock = 8;

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void LayerNormForwardKernel(OperandOut out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float sum = 0;
  for (int c = lane; c < C; c += 32) sum += x[c];
  const float m = WarpSum(sum) / C;
  float var = 0;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    var += d * d;
  }
  const float s = rsqrtf(WarpSum(var) / C + kEps);
  const OperandOut o = out.At(static_cast<size_t>(row) * C);
  for (int c = lane; c < C; c += 32) o.Put(c, (x[c] - m) * s * weight[c] + bias[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp (N, C) += the row's input gradient, the sum stored in `store`; dout read in it.
__global__ void LayerNormBackwardRows(float* dinp, const float* dout, const float* inp,
                                      const float* weight, const float* mean, const float* rstd,
                                      int N, int C, Precision store) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  const float m = mean[row], s = rstd[row];
  float dnorm_mean = 0, dnorm_norm_mean = 0;
  for (int c = lane; c < C; c += 32) {
    const float norm = (inp[base + c] - m) * s;
    const float dnorm = weight[c] * Stored(dout[base + c], store);
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean = WarpSum(dnorm_mean) / C;
  dnorm_norm_mean = WarpSum(dnorm_norm_mean) / C;
  for (int c = lane; c < C; c += 32) {
    const float norm = (inp[base + c] - m) * s;
    const float dnorm = weight[c] * Stored(dout[base + c], store);
    dinp[base + c] =
        Stored(dinp[base + c] + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s, store);
  }
}

// The weight gradient's term of row n, column c: the normalised input times dout.
struct NormTimesDout {
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  int C;
  Precision store;
  __device__ float operator()(int n, int c) const {
    const size_t i = static_cast<size_t>(n) * C + c;
    return (inp[i] - mean[n]) * rstd[n] * Stored(dout[i], store);
  }
};

// The bias gradient's term: dout as stored.
struct StoredDout {
  const float* dout;
  int C;
  Precision store;
  __device__ float operator()(int n, int c) const {
    return Stored(dout[static_cast<size_t>(n) * C + c], store);
  }
};

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, Precision store, bool narrow_out,
                      cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && (!narrow_out || store != Precision::kFp32));
  DROVER_LAUNCH(LayerNormForwardKernel, Blocks(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream)
  (OperandOut{out, narrow_out, store}, mean, rstd, inp, weight, bias, N, C);
  DROVER_CUDA_LAUNCHED();
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, bool accumulate, Precision store, float* scratch,
                       cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0);
  DROVER_LAUNCH(LayerNormBackwardRows, Blocks(N, kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream)
  (dinp, dout, inp, weight, mean, rstd, N, C, store);
  DROVER_CUDA_LAUNCHED();
  // Both sums share the scratch: the stream runs the second's pass 1 after the first's
  // pass 2 has read it.
  ColumnSum(dweight, scratch, N, C, NormTimesDout{dout, inp, mean, rstd, C, store}, accumulate,
            stream);
  ColumnSum(dbias, scratch, N, C, StoredDout{dout, C, store}, accumulate, stream);
}

}  // namespace drover::engine::cuda
