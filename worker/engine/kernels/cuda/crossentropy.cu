// Softmax + cross-entropy over rows padded to Vp columns (kernels/cpu/crossentropy.h): the
// forward keeps each row's log-sum-exp and never writes probabilities; the backward turns
// the logits into their gradient in place. One block per row; the forward reads its row once
// (an online max and sum, as FlashAttention's softmax). The logits are an operand buffer
// (ops.h): 16-bit in a mixed-precision run, else floats read as values of the run's
// precision (the head GEMM's output, which Ops::NarrowWritten leaves unrounded).
#include "worker/engine/kernels/cuda/async_copy.cuh"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T, typename Op>
__device__ T BlockReduce(T v, T* shared, Op op) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();  // shared is reused by the next reduction
  return total;
}

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// A running softmax denominator: the largest value seen and the sum of exp(x - max) over
// what was seen. One read of the row gives both (the row is 200 KB at GPT-2's vocabulary:
// a second pass for the sum would read it from memory again).
struct MaxSum {
  float max;
  float sum;
};
__device__ __forceinline__ MaxSum Seen(MaxSum a, float x) {
  if (x > a.max) return {x, a.sum * expf(a.max - x) + 1.0f};
  return {a.max, a.sum + expf(x - a.max)};
}
struct Combine {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const {
    const float m = fmaxf(a.max, b.max);
    if (m == -INFINITY) return {m, 0.0f};  // neither saw anything
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
  }
};

__global__ void CrossEntropyForwardKernel(float* losses, float* lse, OperandIn logits,
                                          const int32_t* targets, int V, int Vp) {
  __shared__ MaxSum shared[kThreads];
  const int n = blockIdx.x;
  const OperandIn row = logits.At(static_cast<size_t>(n) * Vp);
  MaxSum mine{-INFINITY, 0.0f};
  for (int i = threadIdx.x; i < V; i += blockDim.x) mine = Seen(mine, row.Get(i));
  const MaxSum all = BlockReduce(mine, shared, Combine());
  if (threadIdx.x == 0) {
    const float l = all.max + logf(all.sum);
    lse[n] = l;
    losses[n] = l - row.Get(targets[n]);
  }
}

// The same on a 16-bit operand buffer whose rows start on 16-byte boundaries: 8 logits a
// load. One element at a time, a thread has one 2-byte load in flight: GPT-2's logits (32768
// rows of 50304 at batch 32) took 2.9 ms on an H200, 8 a load 0.9 ms.
template <typename N>
__global__ void CrossEntropyForwardWords(float* losses, float* lse, const N* logits,
                                         const int32_t* targets, int V, int Vp) {
  __shared__ MaxSum shared[kThreads];
  const int n = blockIdx.x;
  const N* row = logits + static_cast<size_t>(n) * Vp;
  const uint4* words = reinterpret_cast<const uint4*>(row);
  MaxSum mine{-INFINITY, 0.0f};
  const int whole = V / kPerWord;  // words of live columns only
  for (int w = threadIdx.x; w < whole; w += blockDim.x) {
    const Word8<N> x = Word8<N>::Load(words + w);
    float v[kPerWord];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      v[k] = ToFloat(x.v[k]);
      m = fmaxf(m, v[k]);
    }
    if (m > mine.max) mine = {m, mine.sum * expf(mine.max - m)};
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) mine.sum += expf(v[k] - mine.max);
  }
  for (int i = whole * kPerWord + static_cast<int>(threadIdx.x); i < V; i += blockDim.x) {
    mine = Seen(mine, ToFloat(row[i]));
  }
  const MaxSum all = BlockReduce(mine, shared, Combine());
  if (threadIdx.x == 0) {
    const float l = all.max + logf(all.sum);
    lse[n] = l;
    losses[n] = l - ToFloat(row[targets[n]]);
  }
}

// The same over a vocabulary split (ops.h): this rank's columns [0, V) give lse (-inf when
// V is 0) and the target's logit, 0 where the target is another rank's (-1).
__global__ void CrossEntropyPartKernel(float* lse, float* target_logits, OperandIn logits,
                                       const int32_t* targets, int V, int Vp) {
  __shared__ MaxSum shared[kThreads];
  const int n = blockIdx.x;
  const OperandIn row = logits.At(static_cast<size_t>(n) * Vp);
  MaxSum mine{-INFINITY, 0.0f};
  for (int i = threadIdx.x; i < V; i += blockDim.x) mine = Seen(mine, row.Get(i));
  const MaxSum all = BlockReduce(mine, shared, Combine());
  if (threadIdx.x == 0) {
    lse[n] = all.sum > 0.0f ? all.max + logf(all.sum) : -INFINITY;
    target_logits[n] = targets[n] >= 0 ? row.Get(targets[n]) : 0.0f;
  }
}

// One thread per row: the parts' log-sum-exps combined, and the loss.
__global__ void CrossEntropyCombineKernel(float* losses, float* lse, const float* lse_parts,
                                          const float* target_logits, int parts, int N) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float m = -INFINITY;
  for (int p = 0; p < parts; ++p) m = fmaxf(m, lse_parts[static_cast<size_t>(p) * N + n]);
  float sum = 0.0f;
  for (int p = 0; p < parts; ++p) sum += expf(lse_parts[static_cast<size_t>(p) * N + n] - m);
  const float l = m + logf(sum);
  lse[n] = l;
  losses[n] = l - target_logits[n];
}

// One block: the mean of the N losses, summed in double.
__global__ void MeanKernel(double* mean_out, const float* losses, int N) {
  __shared__ double shared[kThreads];
  double acc = 0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) acc += losses[i];
  acc = BlockReduce(acc, shared, Sum());
  if (threadIdx.x == 0) *mean_out = acc / N;
}

// dlogits and logits: operand buffers; in place allowed (each element is read before it is
// written).
__global__ void CrossEntropyBackwardKernel(OperandOut dlogits, OperandIn logits, const float* lse,
                                           const int32_t* targets, float dloss, int V, int Vp) {
  const int n = blockIdx.x;
  const OperandIn row = logits.At(static_cast<size_t>(n) * Vp);
  const OperandOut out = dlogits.At(static_cast<size_t>(n) * Vp);
  const float l = lse[n];
  const int target = targets[n];
  for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
    float g = 0.0f;
    if (i < V) g = dloss * expf(row.Get(i) - l) - (i == target ? dloss : 0.0f);
    out.Put(i, g);
  }
}

// The gradient of word w (logits w * 8 on) of a row whose logits are x: dloss (softmax -
// one-hot) for its live columns (< V), 0 for the padding.
template <typename N>
__device__ __forceinline__ Word8<N> GradientWord(const Word8<N>& x, int w, int V, int target,
                                                 float dloss, float lse) {
  Word8<N> g;
#pragma unroll
  for (int k = 0; k < kPerWord; ++k) {
    const int i = w * kPerWord + k;
    float d = 0.0f;
    if (i < V) d = dloss * expf(ToFloat(x.v[k]) - lse) - (i == target ? dloss : 0.0f);
    g.v[k] = ToNarrow<N>(d);
  }
  return g;
}

// The same on 16-bit operand buffers whose rows start on 16-byte boundaries (Vp a multiple
// of 8), 8 elements a load and a store; the same arithmetic per element (GPT-2's logits, as
// above: 4.8 ms one element at a time, 1.65 ms so).
template <typename N>
__global__ void CrossEntropyBackwardWords(N* dlogits, const N* logits, const float* lse,
                                          const int32_t* targets, float dloss, int V, int Vp) {
  const int n = blockIdx.x;
  const uint4* in = reinterpret_cast<const uint4*>(logits + static_cast<size_t>(n) * Vp);
  uint4* out = reinterpret_cast<uint4*>(dlogits + static_cast<size_t>(n) * Vp);
  const float l = lse[n];
  const int target = targets[n];
  for (int w = threadIdx.x; w < Vp / kPerWord; w += blockDim.x) {
    const Word8<N> x = Word8<N>::Load(in + w);
    GradientWord(x, w, V, target, dloss, l).Store(out + w);
  }
}

// The forward and the backward at once, for a training step whose seed (dloss) is known at
// the forward, on a 16-bit operand buffer (rows 16-byte aligned): one block a row copies the
// row into shared memory (cp.async: the whole row's loads in flight at once, with no
// registers held for them), takes its lse and loss from there, and writes its gradient over
// the row (in place allowed: nothing reads the row from global memory after the copy). The
// two kernels above read a row twice from memory and write it once: 3.3 GB each at GPT-2's
// logits (32768 rows of 50304 at batch 32), 0.9 + 1.65 ms on an H200; this reads it once. A
// row must fit in shared memory (GPT-2's is 100 KB: two blocks an SM, one computing while
// the other's copies land). Each thread reads only the words it copied (no barrier needed
// before the sums), the target's logit after BlockReduce's barrier. Per element the
// arithmetic of the two kernels above, so the same lse within the order of its sums.
constexpr unsigned kFusedThreads = 512;

template <typename N>
__global__ void __launch_bounds__(kFusedThreads)
    CrossEntropyFusedWords(N* dlogits, float* losses, float* lse, const N* logits,
                           const int32_t* targets, float dloss, int V, int Vp) {
  __shared__ MaxSum shared[kFusedThreads];
  DROVER_DYNAMIC_SHARED(smem);
  uint4* kept = reinterpret_cast<uint4*>(smem);
  const int n = blockIdx.x;
  const int words = Vp / kPerWord;
  const uint4* in = reinterpret_cast<const uint4*>(logits + static_cast<size_t>(n) * Vp);
  for (int w = threadIdx.x; w < words; w += blockDim.x) CopyAsync<16>(kept + w, in + w, true);
  CommitCopies();
  WaitCopies<0>();
  MaxSum mine{-INFINITY, 0.0f};
  for (int w = threadIdx.x; w < words; w += blockDim.x) {
    if (w * kPerWord >= V) break;  // padding only from here on
    const Word8<N> x = Word8<N>::Load(kept + w);
    float v[kPerWord];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      v[k] = w * kPerWord + k < V ? ToFloat(x.v[k]) : -INFINITY;  // exp gives 0
      m = fmaxf(m, v[k]);
    }
    if (m > mine.max) mine = {m, mine.sum * expf(mine.max - m)};
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) mine.sum += expf(v[k] - mine.max);
  }
  const MaxSum all = BlockReduce(mine, shared, Combine());
  const float l = all.max + logf(all.sum);
  const int target = targets[n];
  if (threadIdx.x == 0) {
    lse[n] = l;
    losses[n] = l - ToFloat(reinterpret_cast<const N*>(kept)[target]);
  }
  uint4* out = reinterpret_cast<uint4*>(dlogits + static_cast<size_t>(n) * Vp);
  for (int w = threadIdx.x; w < words; w += blockDim.x) {
    const Word8<N> x = Word8<N>::Load(kept + w);
    GradientWord(x, w, V, target, dloss, l).Store(out + w);
  }
}

size_t FusedSharedBytes(int Vp) { return sizeof(uint16_t) * static_cast<size_t>(Vp); }

}  // namespace

bool CrossEntropyFusedApplies(const float* dlogits, const float* logits, int Vp, bool narrow) {
  // The static MaxSum array shares the opt-in limit with the row.
  return narrow && Vp % kPerWord == 0 && Aligned16(logits) && Aligned16(dlogits) &&
         FusedSharedBytes(Vp) + sizeof(MaxSum) * kFusedThreads <= SharedOptIn();
}

void CrossEntropyForwardBackward(float* dlogits, float* losses, float* lse, double* mean_out,
                                 const float* logits, const int32_t* targets, float dloss, int N,
                                 int V, int Vp, Precision operands, bool narrow,
                                 cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && V > 0 && Vp >= V && operands != Precision::kFp32);
  DROVER_CUDA_REQUIRE(CrossEntropyFusedApplies(dlogits, logits, Vp, narrow));
  const size_t bytes = FusedSharedBytes(Vp);
  auto launch = [&](auto tag) {
    using H = typename decltype(tag)::type;
    const auto kernel = &CrossEntropyFusedWords<H>;
    DROVER_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
    DROVER_LAUNCH(kernel, N, kFusedThreads, bytes, stream)
    (reinterpret_cast<H*>(dlogits), losses, lse, reinterpret_cast<const H*>(logits), targets, dloss,
     V, Vp);
  };
  if (operands == Precision::kBf16) {
    launch(TypeTag<__nv_bfloat16>{});
  } else {
    launch(TypeTag<__half>{});
  }
  DROVER_CUDA_LAUNCHED();
  DROVER_LAUNCH(MeanKernel, 1, kThreads, 0, stream)(mean_out, losses, N);
  DROVER_CUDA_LAUNCHED();
}

void CrossEntropyForward(float* losses, float* lse, double* mean_out, const float* logits,
                         const int32_t* targets, int N, int V, int Vp, Precision operands,
                         bool narrow, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && V > 0 && Vp >= V);
  DROVER_CUDA_REQUIRE(!narrow || operands != Precision::kFp32);
  if (narrow && Vp % kPerWord == 0 && Aligned16(logits)) {
    if (operands == Precision::kBf16) {
      DROVER_LAUNCH(CrossEntropyForwardWords<__nv_bfloat16>, N, kThreads, 0, stream)
      (losses, lse, reinterpret_cast<const __nv_bfloat16*>(logits), targets, V, Vp);
    } else {
      DROVER_LAUNCH(CrossEntropyForwardWords<__half>, N, kThreads, 0, stream)
      (losses, lse, reinterpret_cast<const __half*>(logits), targets, V, Vp);
    }
  } else {
    DROVER_LAUNCH(CrossEntropyForwardKernel, N, kThreads, 0, stream)
    (losses, lse, OperandIn{logits, narrow, operands}, targets, V, Vp);
  }
  DROVER_CUDA_LAUNCHED();
  DROVER_LAUNCH(MeanKernel, 1, kThreads, 0, stream)(mean_out, losses, N);
  DROVER_CUDA_LAUNCHED();
}

void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                             const int32_t* targets, int N, int V, int Vp, Precision operands,
                             bool narrow, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && V >= 0 && Vp >= V && Vp > 0);
  DROVER_LAUNCH(CrossEntropyPartKernel, N, kThreads, 0, stream)
  (lse, target_logits, OperandIn{logits, narrow, operands}, targets, V, Vp);
  DROVER_CUDA_LAUNCHED();
}

void CrossEntropyCombine(float* losses, float* lse, double* mean_out, const float* lse_parts,
                         const float* target_logits, int parts, int N, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(N > 0 && parts > 0);
  DROVER_LAUNCH(CrossEntropyCombineKernel, (static_cast<unsigned>(N) + kThreads - 1) / kThreads,
                kThreads, 0, stream)
  (losses, lse, lse_parts, target_logits, parts, N);
  DROVER_CUDA_LAUNCHED();
  DROVER_LAUNCH(MeanKernel, 1, kThreads, 0, stream)(mean_out, losses, N);
  DROVER_CUDA_LAUNCHED();
}

void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                          const int32_t* targets, float dloss, int N, int V, int Vp,
                          Precision store, bool narrow_out, cudaStream_t stream) {
  // V may be 0: a vocabulary slice of padding only, whose gradient is zeros.
  DROVER_CUDA_REQUIRE(N > 0 && V >= 0 && Vp >= V && Vp > 0);
  DROVER_CUDA_REQUIRE(!narrow_out || store != Precision::kFp32);
  if (narrow_out && Vp % kPerWord == 0 && Aligned16(logits) && Aligned16(dlogits)) {
    if (store == Precision::kBf16) {
      DROVER_LAUNCH(CrossEntropyBackwardWords<__nv_bfloat16>, N, kThreads, 0, stream)
      (reinterpret_cast<__nv_bfloat16*>(dlogits), reinterpret_cast<const __nv_bfloat16*>(logits),
       lse, targets, dloss, V, Vp);
    } else {
      DROVER_LAUNCH(CrossEntropyBackwardWords<__half>, N, kThreads, 0, stream)
      (reinterpret_cast<__half*>(dlogits), reinterpret_cast<const __half*>(logits), lse, targets,
       dloss, V, Vp);
    }
  } else {
    DROVER_LAUNCH(CrossEntropyBackwardKernel, N, kThreads, 0, stream)
    (OperandOut{dlogits, narrow_out, store}, OperandIn{logits, narrow_out, store}, lse, targets,
     dloss, V, Vp);
  }
  DROVER_CUDA_LAUNCHED();
}

}  // namespace drover::engine::cuda
