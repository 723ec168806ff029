// Causal multi-head attention over packed qkv (kernels/cpu/attention.h) as cuBLAS GEMMs
// around two row kernels, the (B, NH, T, T) probabilities materialised as on the CPU.
// The GEMMs are described in attention_gemms.h (checked on the CPU on every commit):
//   forward:  scores = scale q k^T (into att) -> masked softmax in place -> out = att v
//   backward: datt = dout v^T, dv = att^T dout -> dpre = att (datt - <att, datt>) scale in
//             place, zero above the diagonal -> dq = dpre k, dk = dpre^T q
// The row kernels use one warp per row and write every element of their row, the masked
// ones as zeros, so the GEMMs that read att or dpre need no mask. Deterministic: cuBLAS
// with a fixed configuration, and warp reductions in a fixed order.
//
// A fused flash-style kernel would skip the masked half of the products and never write
// the T x T matrices; this is the simple correct version with tensor-core GEMMs.
#include "worker/engine/kernels/cuda/attention_gemms.h"
#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

namespace drover::engine::cuda {
namespace {

constexpr unsigned kWarpsPerBlock = 8;

__device__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Row `row` of the (B, NH, T) rows of att: scaled scores in, probabilities out, causal
// (t2 <= t, t = row % T); zeros above the diagonal.
__global__ void SoftmaxForwardKernel(float* att, int rows, int T) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = row % T;
  float* a = att + static_cast<size_t>(row) * T;
  float maxv = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) maxv = fmaxf(maxv, a[t2]);
  maxv = WarpMax(maxv);
  float sum = 0;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float e = expf(a[t2] - maxv);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpSum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

// Row `row`: datt in, dpre = att (datt - sum att datt) scale out; zeros above the diagonal.
__global__ void SoftmaxBackwardKernel(float* datt, const float* att, int rows, int T, float scale) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = row % T;
  const float* a = att + static_cast<size_t>(row) * T;
  float* d = datt + static_cast<size_t>(row) * T;
  float weighted = 0;
  for (int t2 = lane; t2 <= t; t2 += 32) weighted += a[t2] * d[t2];
  weighted = WarpSum(weighted);
  for (int t2 = lane; t2 < T; t2 += 32) d[t2] = t2 <= t ? a[t2] * (d[t2] - weighted) * scale : 0.0f;
}

// What each AttentionBuffer is in one call: `in` for those the GEMMs read, `out` for those
// they write (nullptr where the call has no such buffer).
struct Buffers {
  const float* in[kAttentionBufferCount] = {};
  float* out[kAttentionBufferCount] = {};
  void Read(AttentionBuffer b, const float* p) { in[static_cast<int>(b)] = p; }
  void Write(AttentionBuffer b, float* p) {
    in[static_cast<int>(b)] = p;
    out[static_cast<int>(b)] = p;
  }
};

// One description (attention_gemms.h): a strided-batched call over the NH heads per batch
// row b. C is written, never read (beta 0).
void Run(cublasHandle_t blas, const AttentionGemm& g, const Buffers& buffers, int B, int NH,
         Precision operands) {
  const float* a = buffers.in[static_cast<int>(g.a.buffer)];
  const float* b = buffers.in[static_cast<int>(g.b.buffer)];
  float* c = buffers.out[static_cast<int>(g.c.buffer)];
  DROVER_CUDA_REQUIRE(a != nullptr && b != nullptr && c != nullptr);
  const float beta = 0.0f;
  const cublasComputeType_t compute = GemmComputeType(operands, g.narrow);
  for (int row = 0; row < B; ++row) {
    DROVER_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.m,
        g.n, g.k, &g.alpha, a + g.a.offset + row * g.a.row_stride, CUDA_R_32F, g.a.ld,
        static_cast<long long>(g.a.head_stride), b + g.b.offset + row * g.b.row_stride, CUDA_R_32F,
        g.b.ld, static_cast<long long>(g.b.head_stride), &beta,
        c + g.c.offset + row * g.c.row_stride, CUDA_R_32F, g.c.ld,
        static_cast<long long>(g.c.head_stride), NH, compute, CUBLAS_GEMM_DEFAULT));
  }
}

unsigned RowBlocks(int rows) { return Blocks(static_cast<size_t>(rows), kWarpsPerBlock); }

}  // namespace

void AttentionForward(cublasHandle_t blas, float* out, float* att, const float* qkv, int B, int T,
                      int C, int NH, Precision operands, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && NH > 0 && C % NH == 0);
  const float scale = 1.0f / sqrtf(static_cast<float>(C / NH));
  const AttentionForwardGemms plan = PlanAttentionForward(T, C, NH, scale);
  Buffers buffers;
  buffers.Read(AttentionBuffer::kQkv, qkv);
  buffers.Write(AttentionBuffer::kAtt, att);
  buffers.Write(AttentionBuffer::kOut, out);
  const int rows = B * NH * T;
  Run(blas, plan.scores, buffers, B, NH, operands);
  DROVER_LAUNCH(SoftmaxForwardKernel, RowBlocks(rows), kWarpsPerBlock * 32, 0, stream)
  (att, rows, T);
  DROVER_CUDA_LAUNCHED();
  Run(blas, plan.out, buffers, B, NH, operands);
}

void AttentionBackward(cublasHandle_t blas, float* dqkv, float* datt, const float* dout,
                       const float* att, const float* qkv, int B, int T, int C, int NH,
                       Precision operands, cudaStream_t stream) {
  DROVER_CUDA_REQUIRE(B > 0 && T > 0 && NH > 0 && C % NH == 0);
  const float scale = 1.0f / sqrtf(static_cast<float>(C / NH));
  const AttentionBackwardGemms plan = PlanAttentionBackward(T, C, NH);
  Buffers buffers;
  buffers.Read(AttentionBuffer::kQkv, qkv);
  buffers.Read(AttentionBuffer::kAtt, att);
  buffers.Read(AttentionBuffer::kDout, dout);
  buffers.Write(AttentionBuffer::kDqkv, dqkv);
  buffers.Write(AttentionBuffer::kDatt, datt);
  const int rows = B * NH * T;
  Run(blas, plan.datt, buffers, B, NH, operands);
  Run(blas, plan.dv, buffers, B, NH, operands);
  DROVER_LAUNCH(SoftmaxBackwardKernel, RowBlocks(rows), kWarpsPerBlock * 32, 0, stream)
  (datt, att, rows, T, scale);
  DROVER_CUDA_LAUNCHED();
  Run(blas, plan.dq, buffers, B, NH, operands);
  Run(blas, plan.dk, buffers, B, NH, operands);
}

}  // namespace drover::engine::cuda
