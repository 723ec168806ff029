// Token + position embedding (kernels/cpu/encoder.h). The backward scatters by token id:
// instead of atomics (whose order varies from run to run), each thread owns one channel
// and walks every (b, t) in order, so the sums are the same every run.
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;

// out (B, T, C): one thread per element.
__global__ void EncoderForwardKernel(float* out, const int32_t* inp, const float* wte,
                                     const float* wpe, int B, int T, int C) {
  const size_t total = size_t{static_cast<unsigned>(B)} * T * C;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    out[i] = wte[static_cast<size_t>(inp[bt]) * C + c] + wpe[static_cast<size_t>(t) * C + c];
  }
}

// dwte: thread c walks every (b, t) in order. dwpe: thread (t, c) sums over b.
__global__ void EncoderBackwardWteKernel(float* dwte, const float* dout, const int32_t* inp, int BT,
                                         int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int bt = 0; bt < BT; ++bt) {
    dwte[static_cast<size_t>(inp[bt]) * C + c] += dout[static_cast<size_t>(bt) * C + c];
  }
}

__global__ void EncoderBackwardWpeKernel(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  if (i >= size_t{static_cast<unsigned>(T)} * C) return;
  float sum = 0;
  for (int b = 0; b < B; ++b) sum += dout[static_cast<size_t>(b) * T * C + i];
  dwpe[i] += sum;
}

// The same sums into the window [lo, hi) of [dwte | dwpe]: thread c walks every (b, t).
__global__ void EncoderBackwardWindowKernel(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                                            const float* dout, const int32_t* inp, int B, int T,
                                            int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int bt = 0; bt < B * T; ++bt) {
    const float d = dout[static_cast<size_t>(bt) * C + c];
    const size_t token = static_cast<size_t>(inp[bt]) * C + c;
    if (token >= lo && token < hi) dwindow[token - lo] += d;
    const size_t pos = wpe_offset + static_cast<size_t>(bt % T) * C + c;
    if (pos >= lo && pos < hi) dwindow[pos - lo] += d;
  }
}

}  // namespace

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && C > 0);
  const size_t total = size_t{static_cast<unsigned>(B)} * T * C;
  EncoderForwardKernel<<<StrideBlocks(total, kThreads), kThreads, 0, stream>>>(out, inp, wte, wpe,
                                                                               B, T, C);
  DROVER_CUDA_LAUNCHED();
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                     int C, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && C > 0);
  EncoderBackwardWteKernel<<<Blocks(C, kThreads), kThreads, 0, stream>>>(dwte, dout, inp, B * T, C);
  DROVER_CUDA_LAUNCHED();
  EncoderBackwardWpeKernel<<<Blocks(size_t{static_cast<unsigned>(T)} * C, kThreads), kThreads, 0,
                             stream>>>(dwpe, dout, B, T, C);
  DROVER_CUDA_LAUNCHED();
}

void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                           const float* dout, const int32_t* inp, int B, int T, int C,
                           cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && C > 0 && lo <= hi);
  if (lo == hi) return;
  EncoderBackwardWindowKernel<<<Blocks(C, kThreads), kThreads, 0, stream>>>(
      dwindow, lo, hi, wpe_offset, dout, inp, B, T, C);
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
