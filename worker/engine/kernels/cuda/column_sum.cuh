// Deterministic column sums over many rows, for the parameter gradients that sum over every
// (b, t) row: the linear layers' bias and LayerNorm's weight and bias. Two passes, with no
// atomics and a summation order fixed by N and C alone, so the sums repeat bit for bit:
//   pass 1 (column_sum.cu; layernorm.cu fuses its own) leaves one partial sum per column for
//     each chunk of rows, in partial[chunk * C + c];
//   pass 2 (ColumnSumFinish) adds each column's chunk partials in a fixed tree.
// The first version gave each thread one column of a 64-row chunk and pass 2 one thread per
// column walking all 512 chunks (GPT-2 124M, batch 32, on an H200: 6.2 ms a step for the two
// passes, far from the memory's bandwidth): 2-byte loads, and only C threads in pass 2.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "worker/engine/kernels/cuda/store.cuh"
#include "worker/engine/kernels/precision.h"

namespace drover::engine::cuda {

// Rows of one pass-1 chunk: tall, so that pass 2 has few partials to add (128 at N = 32768),
// yet enough chunks times column blocks to fill an H200's 132 SMs several times at GPT-2's
// shapes (6 to 12 column blocks).
inline constexpr int kColumnChunkRows = 256;

inline size_t ColumnSumChunks(int N) { return (N + kColumnChunkRows - 1) / kColumnChunkRows; }
// Floats of scratch one column sum of (N, C) needs.
inline size_t ColumnSumScratch(int N, int C) { return ColumnSumChunks(N) * C; }

// Pass 2: out[c] = [out[c] +] the sum of partial[k * C + c] over the chunks k < chunks.
void ColumnSumFinish(float* out, const float* partial, int chunks, int C, bool accumulate,
                     cudaStream_t stream);

// out (C) = [out +] the sum over n of x(n, c), x (N, C; rows ld apart) read as values of its
// precision (OperandIn: a float one is rounded as it is loaded). partial: ColumnSumScratch(N,
// C) floats.
void ColumnSum(float* out, float* partial, OperandIn x, int N, int C, int ld, bool accumulate,
               cudaStream_t stream);

// NarrowCopy of the floats x (N, C; rows ld apart) into `copy` (16-bit values of p, the same
// layout; the columns past C of each row are not written) and ColumnSum of the narrowed
// values into out, in one read of x: MatmulBackward's dout, which the GEMMs read as the copy
// and the bias gradient sums. The sums equal ColumnSum's bit for bit.
void NarrowCopyAndColumnSum(void* copy, float* out, float* partial, const float* x, int N, int C,
                            int ld, Precision p, bool accumulate, cudaStream_t stream);

}  // namespace drover::engine::cuda
