// Token + position embedding (kernels/cpu/encoder.h). The backward scatters by token id:
// instead of atomics (whose order varies from run to run), the host groups the batch's
// ids (token_buckets.h) and one thread per (distinct id, channel) adds that id's rows in
// order, so the sums are the same every run. The position gradient is a sum over b per
// (t, c).
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr size_t kEverywhere = ~size_t{0};

// out (B, T, C): one thread per element.
__global__ void EncoderForwardKernel(float* out, const int32_t* inp, const float* wte,
                                     const float* wpe, int B, int T, int C, Precision store) {
  const size_t total = size_t{static_cast<unsigned>(B)} * T * C;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    const int32_t id = inp[bt];
    // -1: another tensor-parallel rank's row (ops.h): zero, position included.
    out[i] =
        id < 0 ? 0.0f
               : Stored(wte[static_cast<size_t>(id) * C + c] + wpe[static_cast<size_t>(t) * C + c],
                        store);
  }
}

// Block (j, y), thread x: distinct id j of the buckets (token_buckets.h), channel
// y * blockDim.x + x. Adds the id's dout rows, in order, into element id * C + c of the
// token table, which `out` holds from element lo to hi (out[e - lo]); elements outside it
// are left alone.
__global__ void EncoderBackwardWteKernel(float* out, size_t lo, size_t hi, const float* dout,
                                         const int32_t* buckets, int distinct, int C) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const int j = blockIdx.x;
  if (c >= C) return;  // (the buckets hold no -1: TokenBuckets leaves them out)
  const int32_t* start = buckets + distinct;
  const int32_t* position = start + distinct + 1;
  const size_t e = static_cast<size_t>(buckets[j]) * C + c;
  if (e < lo || e >= hi) return;
  float sum = 0;
  for (int p = start[j]; p < start[j + 1]; ++p)
    sum += dout[static_cast<size_t>(position[p]) * C + c];
  out[e - lo] += sum;
}

// Thread (t, c): sums dout over b into element wpe_offset + t * C + c of [dwte | dwpe],
// which `out` holds from lo to hi.
__global__ void EncoderBackwardWpeKernel(float* out, size_t lo, size_t hi, size_t wpe_offset,
                                         const float* dout, int B, int T, int C) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= size_t{static_cast<unsigned>(T)} * C) return;
  const size_t e = wpe_offset + i;
  if (e < lo || e >= hi) return;
  float sum = 0;
  for (int b = 0; b < B; ++b) sum += dout[static_cast<size_t>(b) * T * C + i];
  out[e - lo] += sum;
}

void LaunchBackward(float* wte_out, float* wpe_out, size_t lo, size_t hi, size_t wpe_offset,
                    const float* dout, const int32_t* buckets, int distinct, int B, int T, int C,
                    cudaStream_t stream) {
  if (distinct > 0) {
    const dim3 grid(static_cast<unsigned>(distinct), Blocks(C, kThreads));
    DROVER_LAUNCH(EncoderBackwardWteKernel, grid, kThreads, 0, stream)
    (wte_out, lo, hi, dout, buckets, distinct, C);
    DROVER_CUDA_LAUNCHED();
  }
  DROVER_LAUNCH(EncoderBackwardWpeKernel, Blocks(size_t{static_cast<unsigned>(T)} * C, kThreads),
                kThreads, 0, stream)
  (wpe_out, lo, hi, wpe_offset, dout, B, T, C);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, Precision store, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && C > 0);
  const size_t total = size_t{static_cast<unsigned>(B)} * T * C;
  DROVER_LAUNCH(EncoderForwardKernel, StrideBlocks(total, kThreads), kThreads, 0, stream)
  (out, inp, wte, wpe, B, T, C, store);
  DROVER_CUDA_LAUNCHED();
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* buckets,
                     int distinct, int B, int T, int C, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && C > 0 && distinct >= 0);
  // Two tables, each whole: the window of each is everything, and wpe starts at its 0.
  LaunchBackward(dwte, dwpe, 0, kEverywhere, 0, dout, buckets, distinct, B, T, C, stream);
}

void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                           const float* dout, const int32_t* buckets, int distinct, int B, int T,
                           int C, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && C > 0 && lo <= hi && distinct >= 0);
  if (lo == hi) return;
  LaunchBackward(dwindow, dwindow, lo, hi, wpe_offset, dout, buckets, distinct, B, T, C, stream);
}

}  // namespace drover::engine::cuda
