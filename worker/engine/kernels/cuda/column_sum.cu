// Pass 2 of the column sums (column_sum.cuh): one thread per column adds the chunk sums in
// chunk order.
#include "worker/engine/kernels/cuda/column_sum.cuh"

namespace drover::engine::cuda {
namespace {

__global__ void ColumnSumFinishKernel(float* out, const float* partial, int chunks, int C,
                                      bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0;
  for (int k = 0; k < chunks; ++k) sum += partial[static_cast<size_t>(k) * C + c];
  out[c] = accumulate ? out[c] + sum : sum;
}

}  // namespace

void ColumnSumFinish(float* out, const float* partial, int N, int C, bool accumulate,
                     cudaStream_t stream) {
  const int chunks = static_cast<int>(ColumnSumChunks(N));
  DROVER_LAUNCH(ColumnSumFinishKernel, Blocks(C, kColumnThreads), kColumnThreads, 0, stream)
  (out, partial, chunks, C, accumulate);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
