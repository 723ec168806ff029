// Deterministic column sums over many rows, for the parameter gradients that sum over every
// (b, t) row: the linear layers' bias and LayerNorm's weight and bias. One thread per
// column walking all N rows would serialise N = B*T loads (16k at GPT-2's shapes) on only
// C threads, milliseconds per call; instead pass 1 gives each thread one column of one
// chunk of kColumnChunkRows rows (adjacent threads read adjacent columns, so the loads
// coalesce), and pass 2 adds each column's chunk sums in chunk order. The order is fixed,
// so the sums repeat bit for bit, with no atomics.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"

namespace drover::engine::cuda {

inline constexpr int kColumnChunkRows = 64;
inline constexpr unsigned kColumnThreads = 256;

inline size_t ColumnSumChunks(int N) { return (N + kColumnChunkRows - 1) / kColumnChunkRows; }
// Floats of scratch one column sum of (N, C) needs.
inline size_t ColumnSumScratch(int N, int C) { return ColumnSumChunks(N) * C; }

// Pass 1: partial[chunk * C + c] = the sum of value(n, c) over the chunk's rows n.
template <typename Value>
__global__ void ColumnPartialsKernel(float* partial, int N, int C, Value value) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int first = blockIdx.y * kColumnChunkRows;
  const int end = min(N, first + kColumnChunkRows);
  float sum = 0;
  for (int n = first; n < end; ++n) sum += value(n, c);
  partial[static_cast<size_t>(blockIdx.y) * C + c] = sum;
}

// Pass 2 (column_sum.cu): out[c] = [out[c] +] the sum of the chunks' partial[., c] in order.
void ColumnSumFinish(float* out, const float* partial, int N, int C, bool accumulate,
                     cudaStream_t stream);

// out (C) = [out +] sum over n of value(n, c); partial holds ColumnSumScratch(N, C) floats.
template <typename Value>
void ColumnSum(float* out, float* partial, int N, int C, Value value, bool accumulate,
               cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && ColumnSumChunks(N) <= 65535);
  const dim3 grid(Blocks(C, kColumnThreads), static_cast<unsigned>(ColumnSumChunks(N)));
  DROVER_LAUNCH(ColumnPartialsKernel<Value>, grid, kColumnThreads, 0, stream)(partial, N, C, value);
  DROVER_CUDA_LAUNCHED();
  ColumnSumFinish(out, partial, N, C, accumulate, stream);
}

}  // namespace drover::engine::cuda
