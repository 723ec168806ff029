// The CUDA attention's GEMM descriptions (kernels/cuda/attention_gemms.h), executed here
// by a plain column-major strided GEMM with the same arguments cuBLAS gets, with the
// masked softmax between them written out plainly, must give the CPU attention's
// probabilities, output and input gradient. Every element a GEMM touches is bounds-checked
// against its buffer, so a wrong leading dimension or stride fails here rather than on
// the GPU.
#include "worker/engine/kernels/cuda/attention_gemms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/kernels/ops.h"

namespace drover::engine::cuda {
namespace {

using Buffers = std::map<AttentionBuffer, std::vector<float>*>;

// Element (row, col) of a column-major matrix, bounds-checked.
float& At(std::vector<float>& v, size_t base, int ld, int row, int col) {
  const size_t i = base + row + static_cast<size_t>(col) * ld;
  if (i >= v.size()) {
    ADD_FAILURE() << "element " << i << " is past the buffer's " << v.size();
    static float sink;
    return sink;
  }
  return v[i];
}

// What cublasGemmStridedBatchedEx does with the description, one call per batch row b.
void Execute(const AttentionGemm& g, Buffers& buffers, int B, int NH) {
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      auto base = [&](const AttentionMatrix& m) {
        return m.offset + b * m.row_stride + h * m.head_stride;
      };
      std::vector<float>& A = *buffers.at(g.a.buffer);
      std::vector<float>& Bm = *buffers.at(g.b.buffer);
      std::vector<float>& C = *buffers.at(g.c.buffer);
      for (int j = 0; j < g.n; ++j) {
        for (int i = 0; i < g.m; ++i) {
          double sum = 0;
          for (int p = 0; p < g.k; ++p) {
            const float a =
                g.trans_a ? At(A, base(g.a), g.a.ld, p, i) : At(A, base(g.a), g.a.ld, i, p);
            const float bv =
                g.trans_b ? At(Bm, base(g.b), g.b.ld, j, p) : At(Bm, base(g.b), g.b.ld, p, j);
            sum += double{a} * bv;
          }
          At(C, base(g.c), g.c.ld, i, j) = static_cast<float>(g.alpha * sum);
        }
      }
    }
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-5 + 2e-4 * std::fabs(want[i])) << what << " element " << i;
  }
}

TEST(AttentionGemmsTest, ExecutedOnTheCpuTheyGiveTheCpuAttention) {
  const int B = 2, T = 37, C = 48, NH = 3;  // HS 16; T not a multiple of anything
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  std::vector<float> qkv = random(static_cast<size_t>(B) * T * 3 * C);
  std::vector<float> dout = random(static_cast<size_t>(B) * T * C);
  const size_t square = static_cast<size_t>(B) * NH * T * T;

  std::vector<float> want_out(B * T * C), want_att(square), want_dqkv(qkv.size());
  CpuOps()->AttentionForward(want_out.data(), want_att.data(), qkv.data(), B, T, C, NH,
                             Precision::kFp32);
  CpuOps()->AttentionBackward(want_dqkv.data(), dout.data(), false, want_out.data(),
                              want_att.data(), qkv.data(), B, T, C, NH, Precision::kFp32);

  // Garbage where the kernels must write everything: NaN everywhere.
  std::vector<float> out(want_out.size(), NAN), att(square, NAN), datt(square, NAN),
      dqkv(qkv.size(), NAN);
  Buffers buffers = {{AttentionBuffer::kQkv, &qkv},   {AttentionBuffer::kAtt, &att},
                     {AttentionBuffer::kOut, &out},   {AttentionBuffer::kDout, &dout},
                     {AttentionBuffer::kDqkv, &dqkv}, {AttentionBuffer::kDatt, &datt}};

  // Forward: scores, the masked softmax (attention.cu's SoftmaxForwardKernel), att v.
  const AttentionForwardGemms fwd = PlanAttentionForward(T, C, NH, scale);
  EXPECT_TRUE(fwd.scores.narrow);
  EXPECT_FALSE(fwd.out.narrow);
  Execute(fwd.scores, buffers, B, NH);
  for (size_t row = 0; row < square / T; ++row) {
    float* a = att.data() + row * T;
    const int t = static_cast<int>(row % T);
    float maxv = -INFINITY, sum = 0;
    for (int t2 = 0; t2 <= t; ++t2) maxv = std::fmax(maxv, a[t2]);
    for (int t2 = 0; t2 <= t; ++t2) sum += a[t2] = std::exp(a[t2] - maxv);
    for (int t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
  }
  Execute(fwd.out, buffers, B, NH);
  ExpectClose(att, want_att, "att");
  ExpectClose(out, want_out, "out");

  // Backward: datt and dv, the softmax backward (SoftmaxBackwardKernel), dq and dk.
  const AttentionBackwardGemms bwd = PlanAttentionBackward(T, C, NH);
  EXPECT_TRUE(bwd.datt.narrow);
  EXPECT_FALSE(bwd.dv.narrow || bwd.dq.narrow || bwd.dk.narrow);
  Execute(bwd.datt, buffers, B, NH);
  Execute(bwd.dv, buffers, B, NH);
  for (size_t row = 0; row < square / T; ++row) {
    const float* a = att.data() + row * T;
    float* d = datt.data() + row * T;
    const int t = static_cast<int>(row % T);
    float weighted = 0;
    for (int t2 = 0; t2 <= t; ++t2) weighted += a[t2] * d[t2];
    for (int t2 = 0; t2 < T; ++t2) d[t2] = t2 <= t ? a[t2] * (d[t2] - weighted) * scale : 0.0f;
  }
  Execute(bwd.dq, buffers, B, NH);
  Execute(bwd.dk, buffers, B, NH);
  ExpectClose(dqkv, want_dqkv, "dqkv");
}

}  // namespace
}  // namespace drover::engine::cuda
