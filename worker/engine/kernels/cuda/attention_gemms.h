// The six GEMMs of causal attention over packed qkv (kernels/cpu/attention.h), written down
// as data in cuBLAS's column-major terms. attention.cu hands each to
// cublasGemmStridedBatchedEx, one call per batch row b with the NH heads as the strided
// batch (qkv's rows interleave the heads, so b and h have no common stride); a CPU test
// executes the same descriptions with a plain column-major GEMM against the CPU attention
// (tests/unit/worker/engine/kernels/attention_gemms_test.cc). The transposes, leading
// dimensions and offsets are thereby checked on every commit, on machines with no GPU.
// Plain C++, no CUDA: nvcc and the host compiler both read it.
//
// Row-major X (R, S) with row stride ld is column-major X^T (S, R) with leading dimension ld,
// so each product is computed transposed. Per head (b, h), with HS = C / NH, the rows t of
// q, k and v are 3C floats apart and those of out, dout are C apart:
//   scores (T, T) = scale q k^T    as  scores^T = k q^T      op (T, N)  m T   n T  k HS
//   out (T, HS)   = att v          as  out^T = v^T att^T     op (N, N)  m HS  n T  k T
//   datt (T, T)   = dout v^T       as  datt^T = v dout^T     op (T, N)  m T   n T  k HS
//   dv (T, HS)    = att^T dout     as  dv^T = dout^T att     op (N, T)  m HS  n T  k T
//   dq (T, HS)    = dpre k         as  dq^T = k^T dpre^T     op (N, N)  m HS  n T  k T
//   dk (T, HS)    = dpre^T q       as  dk^T = q^T dpre       op (N, T)  m HS  n T  k T
// The (T, T) products are computed whole, above the diagonal too; the softmax kernels then
// write zeros there (att and dpre), so the products that read them need no mask. That
// costs the causal half of the attention FLOPs, which a fused kernel would save.
#pragma once

#include <cstddef>

namespace drover::engine::cuda {

// The buffers the GEMMs read and write. kAtt receives the scores, which the softmax then
// turns into the probabilities in place. kDatt is the backward's (B, NH, T, T) scratch:
// datt, which the softmax backward turns into dpre in place.
enum class AttentionBuffer { kQkv, kAtt, kOut, kDout, kDqkv, kDatt };
inline constexpr int kAttentionBufferCount = 6;

// A matrix of head (b, h) starts at offset + b * row_stride + h * head_stride floats.
struct AttentionMatrix {
  AttentionBuffer buffer;
  size_t offset;
  size_t row_stride;
  size_t head_stride;
  int ld;
};

// C = alpha op(A) op(B) (column-major; C is overwritten). `narrow` says both operands are
// stored in the run's precision (q, k, v, dout): their products may be formed in it. The
// others read the fp32 probabilities or their gradient.
struct AttentionGemm {
  bool trans_a, trans_b;
  int m, n, k;
  float alpha;
  AttentionMatrix a, b, c;
  bool narrow;
};

struct AttentionForwardGemms {
  AttentionGemm scores;  // into kAtt, then the masked softmax in place
  AttentionGemm out;
};

// In order: datt and dv, then the softmax backward (dpre over datt in kDatt), then dq, dk.
struct AttentionBackwardGemms {
  AttentionGemm datt, dv, dq, dk;
};

namespace attention_detail {

// q, k or v (which = 0, 1, 2) of qkv or dqkv.
inline AttentionMatrix Qkv(AttentionBuffer buffer, int which, int T, int C, int NH) {
  return {buffer, static_cast<size_t>(which) * C, static_cast<size_t>(T) * 3 * C,
          static_cast<size_t>(C / NH), 3 * C};
}
inline AttentionMatrix Rows(AttentionBuffer buffer, int T, int C, int NH) {  // out, dout
  return {buffer, 0, static_cast<size_t>(T) * C, static_cast<size_t>(C / NH), C};
}
inline AttentionMatrix Square(AttentionBuffer buffer, int T, int NH) {  // att, datt
  const size_t tt = static_cast<size_t>(T) * T;
  return {buffer, 0, NH * tt, tt, T};
}

}  // namespace attention_detail

inline AttentionForwardGemms PlanAttentionForward(int T, int C, int NH, float scale) {
  using namespace attention_detail;
  const int HS = C / NH;
  const AttentionBuffer qkv = AttentionBuffer::kQkv;
  return {
      /*scores=*/{true, false, T, T, HS, scale, Qkv(qkv, 1, T, C, NH), Qkv(qkv, 0, T, C, NH),
                  Square(AttentionBuffer::kAtt, T, NH), true},
      /*out=*/
      {false, false, HS, T, T, 1.0f, Qkv(qkv, 2, T, C, NH), Square(AttentionBuffer::kAtt, T, NH),
       Rows(AttentionBuffer::kOut, T, C, NH), false},
  };
}

inline AttentionBackwardGemms PlanAttentionBackward(int T, int C, int NH) {
  using namespace attention_detail;
  const int HS = C / NH;
  const AttentionBuffer qkv = AttentionBuffer::kQkv, dqkv = AttentionBuffer::kDqkv;
  const AttentionMatrix dout = Rows(AttentionBuffer::kDout, T, C, NH);
  const AttentionMatrix att = Square(AttentionBuffer::kAtt, T, NH);
  const AttentionMatrix scratch = Square(AttentionBuffer::kDatt, T, NH);
  return {
      /*datt=*/{true, false, T, T, HS, 1.0f, Qkv(qkv, 2, T, C, NH), dout, scratch, true},
      /*dv=*/{false, true, HS, T, T, 1.0f, dout, att, Qkv(dqkv, 2, T, C, NH), false},
      /*dq=*/
      {false, false, HS, T, T, 1.0f, Qkv(qkv, 1, T, C, NH), scratch, Qkv(dqkv, 0, T, C, NH), false},
      /*dk=*/
      {false, true, HS, T, T, 1.0f, Qkv(qkv, 0, T, C, NH), scratch, Qkv(dqkv, 1, T, C, NH), false},
  };
}

}  // namespace drover::engine::cuda
