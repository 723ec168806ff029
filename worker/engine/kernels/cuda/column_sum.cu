// The column sums' two passes (column_sum.cuh). Pass 1: a block of kGroups x kLanes threads
// takes kGroups * K adjacent columns of one chunk; thread (g, l) sums its K columns over the
// chunk's rows l, l + kLanes, ... in order, and the block adds its lanes in lane order. Where
// rows are 16-byte aligned K is 8 (one 16-byte load of 16-bit values, two of floats, so a
// warp reads 256 adjacent columns of a row), else 1; each column's order is the same either
// way, so the sums do not depend on alignment. Pass 2: a block per kFinishColumns columns,
// kFinishLanes lanes each adding every kFinishLanes-th chunk, then a fixed tree.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "worker/engine/kernels/cuda/column_sum.cuh"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"

namespace drover::engine::cuda {
namespace {

constexpr int kGroups = 32;  // column groups of a pass-1 block (threadIdx.x): a warp
constexpr int kLanes = 8;    // row lanes (threadIdx.y)
constexpr int kVector = 8;   // columns of a group where rows are 16-byte aligned
// Rows a lane loads before it adds any: the loads of a batch are in flight together (a
// NarrowingRows store between them would otherwise order each load after the last store).
constexpr int kBatch = 4;
constexpr int kFinishColumns = 32;
constexpr int kFinishLanes = 16;

// The rows pass 1 reads. Load<K>(n, c, v): v[k] = the value at (n, c + k), k < K (K is
// kVector only where the launcher found rows 16-byte aligned). Keep<K>: what the source does
// with the values once loaded (NarrowingRows stores them).

// 16-bit values of type N.
template <typename N>
struct NarrowRows {
  const N* x;
  int ld;
  template <int K>
  __device__ __forceinline__ void Load(int n, int c, float (&v)[K]) const {
    const N* p = x + static_cast<size_t>(n) * ld + c;
    if constexpr (K == kVector) {
      const Word8<N> w = Word8<N>::Load(reinterpret_cast<const uint4*>(p));
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = ToFloat(w.v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = ToFloat(p[k]);
    }
  }
  template <int K>
  __device__ __forceinline__ void Keep(int, int, const float (&)[K]) const {}
};

// Floats, read as values of `store` (an fp32 run's dout, or one DROVER_CUDA_GEMM_INPUTS=fp32
// leaves unstaged).
struct StoredRows {
  const float* x;
  int ld;
  Precision store;
  template <int K>
  __device__ __forceinline__ void Load(int n, int c, float (&v)[K]) const {
    LoadFloats<K>(x + static_cast<size_t>(n) * ld + c, v);
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = Stored(v[k], store);
  }
  template <int K>
  __device__ __forceinline__ void Keep(int, int, const float (&)[K]) const {}
};

// Floats narrowed to N as they are read, and stored so into `copy` (rows ld apart too).
template <typename N>
struct NarrowingRows {
  const float* x;
  N* copy;
  int ld;
  template <int K>
  __device__ __forceinline__ void Load(int n, int c, float (&v)[K]) const {
    LoadFloats<K>(x + static_cast<size_t>(n) * ld + c, v);
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = ToFloat(ToNarrow<N>(v[k]));
  }
  // v holds values of N already: converting them back is exact.
  template <int K>
  __device__ __forceinline__ void Keep(int n, int c, const float (&v)[K]) const {
    N* p = copy + static_cast<size_t>(n) * ld + c;
    if constexpr (K == kVector) {
      Word8<N> w;
#pragma unroll
      for (int k = 0; k < K; ++k) w.v[k] = ToNarrow<N>(v[k]);
      w.Store(reinterpret_cast<uint4*>(p));
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) p[k] = ToNarrow<N>(v[k]);
    }
  }
};

// sum[k] += the values of columns c + k over rows n, n + kLanes, ... < end, in row order.
template <int K, typename Rows>
__device__ __forceinline__ void SumRows(const Rows& rows, int n, int end, int c, float (&sum)[K]) {
  for (; n + (kBatch - 1) * kLanes < end; n += kBatch * kLanes) {
    float v[kBatch][K];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) rows.template Load<K>(n + b * kLanes, c, v[b]);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      rows.template Keep<K>(n + b * kLanes, c, v[b]);
#pragma unroll
      for (int k = 0; k < K; ++k) sum[k] += v[b][k];
    }
  }
  for (; n < end; n += kLanes) {
    float v[K];
    rows.template Load<K>(n, c, v);
    rows.template Keep<K>(n, c, v);
#pragma unroll
    for (int k = 0; k < K; ++k) sum[k] += v[k];
  }
}

// Pass 1: partial[chunk * C + c] = the sum of rows(n, c) over the chunk's rows n.
template <int K, typename Rows>
__global__ void ColumnPartialsKernel(float* partial, int N, int C, Rows rows) {
  __shared__ float lane_sums[kLanes][kGroups * K];
  const int block_c = blockIdx.x * kGroups * K;
  const int c = block_c + threadIdx.x * K;
  const int first = blockIdx.y * kColumnChunkRows;
  const int end = min(N, first + kColumnChunkRows);
  float sum[K] = {};
  if (c + K <= C) {
    SumRows<K>(rows, first + threadIdx.y, end, c, sum);
  } else {
    // The last group of a C that is not a multiple of K: its columns one by one.
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (c + k >= C) break;
      float s[1] = {0.0f};
      SumRows<1>(rows, first + threadIdx.y, end, c + k, s);
      sum[k] = s[0];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) lane_sums[threadIdx.y][threadIdx.x * K + k] = sum[k];
  __syncthreads();
  for (int j = threadIdx.y * kGroups + threadIdx.x; j < kGroups * K && block_c + j < C;
       j += kGroups * kLanes) {
    float s = lane_sums[0][j];
    for (int l = 1; l < kLanes; ++l) s += lane_sums[l][j];
    partial[static_cast<size_t>(blockIdx.y) * C + block_c + j] = s;
  }
}

__global__ void ColumnSumFinishKernel(float* out, const float* partial, int chunks, int C,
                                      bool accumulate) {
  __shared__ float lane_sums[kFinishLanes][kFinishColumns];
  const int c = blockIdx.x * kFinishColumns + threadIdx.x;
  float sum = 0;
  if (c < C) {
    for (int k = threadIdx.y; k < chunks; k += kFinishLanes) {
      sum += partial[static_cast<size_t>(k) * C + c];
    }
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  for (int s = kFinishLanes / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.y) < s) {
      lane_sums[threadIdx.y][threadIdx.x] += lane_sums[threadIdx.y + s][threadIdx.x];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < C) {
    out[c] = accumulate ? out[c] + lane_sums[0][threadIdx.x] : lane_sums[0][threadIdx.x];
  }
}

// Whether rows of x (and of copy, where there is one) ld elements apart take 16-byte loads.
bool Vectorizable(const void* x, const void* copy, int ld) {
  return Aligned16(x) && (copy == nullptr || Aligned16(copy)) && ld % kVector == 0;
}

template <typename Rows>
void Partials(float* partial, int N, int C, bool vector, Rows rows, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && C > 0 && ColumnSumChunks(N) <= 65535);
  const dim3 block(kGroups, kLanes);
  const auto chunks = static_cast<unsigned>(ColumnSumChunks(N));
  // A kernel of two template arguments through a pointer: DROVER_LAUNCH is a macro.
  if (vector) {
    const auto kernel = &ColumnPartialsKernel<kVector, Rows>;
    DROVER_LAUNCH(kernel, dim3(Blocks(C, kGroups * kVector), chunks), block, 0, stream)
    (partial, N, C, rows);
  } else {
    const auto kernel = &ColumnPartialsKernel<1, Rows>;
    DROVER_LAUNCH(kernel, dim3(Blocks(C, kGroups), chunks), block, 0, stream)(partial, N, C, rows);
  }
  DROVER_CUDA_LAUNCHED();
}

}  // namespace

void ColumnSumFinish(float* out, const float* partial, int chunks, int C, bool accumulate,
                     cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(chunks > 0 && C > 0);
  DROVER_LAUNCH(ColumnSumFinishKernel, Blocks(C, kFinishColumns),
                dim3(kFinishColumns, kFinishLanes), 0, stream)
  (out, partial, chunks, C, accumulate);
  DROVER_CUDA_LAUNCHED();
}

void ColumnSum(float* out, float* partial, OperandIn x, int N, int C, int ld, bool accumulate,
               cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(ld >= C);
  const bool vector = Vectorizable(x.data, nullptr, ld);
  if (!x.narrow) {
    Partials(partial, N, C, vector, StoredRows{static_cast<const float*>(x.data), ld, x.precision},
             stream);
  } else if (x.precision == Precision::kBf16) {
    Partials(partial, N, C, vector,
             NarrowRows<__nv_bfloat16>{static_cast<const __nv_bfloat16*>(x.data), ld}, stream);
  } else {
    DROVER_CUDA_REQUIRE(x.precision == Precision::kFp16);
    Partials(partial, N, C, vector, NarrowRows<__half>{static_cast<const __half*>(x.data), ld},
             stream);
  }
  ColumnSumFinish(out, partial, static_cast<int>(ColumnSumChunks(N)), C, accumulate, stream);
}

void NarrowCopyAndColumnSum(void* copy, float* out, float* partial, const float* x, int N, int C,
                            int ld, Precision p, bool accumulate, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(ld >= C);
  const bool vector = Vectorizable(x, copy, ld);
  if (p == Precision::kBf16) {
    Partials(partial, N, C, vector,
             NarrowingRows<__nv_bfloat16>{x, static_cast<__nv_bfloat16*>(copy), ld}, stream);
  } else {
    DROVER_CUDA_REQUIRE(p == Precision::kFp16);
    Partials(partial, N, C, vector, NarrowingRows<__half>{x, static_cast<__half*>(copy), ld},
             stream);
  }
  ColumnSumFinish(out, partial, static_cast<int>(ColumnSumChunks(N)), C, accumulate, stream);
}

}  // namespace drover::engine::cuda
