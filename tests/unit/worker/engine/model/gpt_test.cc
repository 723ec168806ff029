// GptConfig, the tensor table and arena layout, GPT-2 init, and Forward's bookkeeping.
#include "worker/engine/model/gpt.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace drover::engine {
namespace {

GptConfig Tiny() { return GptConfig{8, 37, 128, 2, 2, 16}; }

TEST(GptConfigTest, FromSpecPadsVocabularyToMultipleOf128) {
  ModelSpec spec;
  spec.n_layer = 12;
  spec.n_head = 12;
  spec.n_embd = 768;
  spec.block_size = 1024;
  spec.vocab_size = 50257;
  const GptConfig c = GptConfig::FromSpec(spec);
  EXPECT_EQ(c, (GptConfig{1024, 50257, 50304, 12, 12, 768}));
  EXPECT_EQ(PaddedVocabSize(256), 256);
  EXPECT_EQ(PaddedVocabSize(1), 128);
  EXPECT_TRUE(c.Validate().ok());
  // GPT-2 124M: the number everyone quotes, with wte padded to 50304 rows.
  EXPECT_EQ(GptNumParams(c), 124475904u);
}

TEST(GptConfigTest, ValidateNamesTheBadField) {
  GptConfig c = Tiny();
  c.num_heads = 3;
  Status s = c.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_heads"), std::string::npos) << s;
  c = Tiny();
  c.num_layers = 0;
  EXPECT_NE(c.Validate().message().find("num_layers"), std::string::npos);
  c = Tiny();
  c.padded_vocab_size = 30;
  EXPECT_NE(c.Validate().message().find("padded_vocab_size"), std::string::npos);
}

TEST(GptTest, TensorTableIsLayerMajorContiguousWithDecayFlags) {
  Gpt m(Tiny());
  const auto& t = m.tensors();
  ASSERT_EQ(t.size(), 2u + 2 * 12 + 2);
  size_t off = 0;
  for (const TensorInfo& x : t) {
    EXPECT_EQ(x.offset, off) << x.name;
    off += x.numel;
    EXPECT_EQ(x.decay, x.shape.size() == 2) << x.name;  // matrices and embeddings only
  }
  EXPECT_EQ(off, m.num_params());
  EXPECT_EQ(t[0].name, "wte");
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{128, 16}));
  EXPECT_EQ(t[2].name, "h.0.ln1w");
  EXPECT_EQ(t[4].name, "h.0.qkvw");
  EXPECT_EQ(t[4].shape, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(t[13].name, "h.0.fcprojb");
  EXPECT_EQ(t.back().name, "lnfb");
  // One layer is one contiguous range, and layers tile the middle of the arena.
  auto [b0, e0] = m.LayerRange(0);
  auto [b1, e1] = m.LayerRange(1);
  EXPECT_EQ(b0, m.FindTensor("h.0.ln1w")->offset);
  EXPECT_EQ(e0, b1);
  EXPECT_EQ(e1, m.FindTensor("lnfw")->offset);
  EXPECT_EQ(m.FindTensor("nope"), nullptr);
}

TEST(GptTest, InitIsDeterministicAndFollowsGpt2) {
  const GptConfig c{64, 300, 384, 4, 4, 64};
  Gpt a(c), b(c), other(c);
  a.InitRandom(42);
  b.InitRandom(42);
  other.InitRandom(43);
  EXPECT_EQ(std::memcmp(a.params(), b.params(), sizeof(float) * a.num_params()), 0);
  EXPECT_NE(std::memcmp(a.params(), other.params(), sizeof(float) * a.num_params()), 0);
  auto stats = [&](const char* name, size_t n = 0) {
    const TensorInfo* t = a.FindTensor(name);
    const float* x = a.params() + t->offset;
    n = n ? n : t->numel;
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
      s += x[i];
      s2 += double(x[i]) * x[i];
    }
    return std::make_pair(s / n, std::sqrt(s2 / n - (s / n) * (s / n)));
  };
  auto [m_wte, sd_wte] = stats("wte", 300 * 64);
  EXPECT_NEAR(m_wte, 0.0, 0.001);
  EXPECT_NEAR(sd_wte, 0.02, 0.0005);
  auto [m_fc, sd_fc] = stats("h.1.fcw");
  EXPECT_NEAR(sd_fc, 0.02, 0.0005);
  auto [m_proj, sd_proj] = stats("h.2.fcprojw");
  EXPECT_NEAR(sd_proj, 0.02 / std::sqrt(8.0), 0.0003);
  auto [m_ap, sd_ap] = stats("h.0.attprojw");
  EXPECT_NEAR(sd_ap, 0.02 / std::sqrt(8.0), 0.0003);
  const float* wte = a.params() + a.FindTensor("wte")->offset;
  for (int i = 300 * 64; i < 384 * 64; i++) ASSERT_EQ(wte[i], 0.0f) << "padded row";
  EXPECT_EQ(stats("h.3.ln2w"), std::make_pair(1.0, 0.0));
  EXPECT_EQ(stats("lnfb"), std::make_pair(0.0, 0.0));
  EXPECT_EQ(stats("h.1.qkvb"), std::make_pair(0.0, 0.0));
}

TEST(GptTest, InitialLossIsNearUniformAndNextTokenLogitsMatchForward) {
  Gpt m(Tiny());
  m.InitRandom(1);
  const int B = 2, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) {
    in[i] = (i * 5) % 37;
    tg[i] = (i * 11 + 1) % 37;
  }
  const float loss = m.Forward(in.data(), tg.data(), B, T);
  EXPECT_NEAR(loss, std::log(37.0), 0.05);
  // The last position of sequence 1 of the batch, computed alone (longer contexts keep
  // only the last maxT tokens).
  std::vector<float> row(m.logits() + (2 * T - 1) * 128, m.logits() + (2 * T - 1) * 128 + 37);
  std::vector<int32_t> ctx = {3, 3, 3};
  ctx.insert(ctx.end(), in.begin() + T, in.end());
  const std::vector<float> next = m.NextTokenLogits(ctx.data(), ctx.size());
  ASSERT_EQ(next.size(), 37u);
  for (int v = 0; v < 37; v++) EXPECT_NEAR(next[v], row[v], 1e-5);
  // A smaller batch after a bigger one reuses the arena; results do not depend on it.
  const float again = m.Forward(in.data(), tg.data(), B, T);
  EXPECT_FLOAT_EQ(loss, again);
}

TEST(GptTest, GradientsDoNotDependOnArenaReuse) {
  Gpt m(Tiny());
  m.InitRandom(3);
  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; i++) {
    in[i] = (i * 7) % 37;
    tg[i] = (i * 3) % 37;
  }
  m.ZeroGrad();
  m.Forward(in.data(), tg.data(), 1, 4);  // small first, then grow the arena
  m.Forward(in.data(), tg.data(), 2, 8);
  m.Backward();
  std::vector<float> g1(m.grads(), m.grads() + m.num_params());
  Gpt fresh(Tiny());
  std::memcpy(fresh.params(), m.params(), sizeof(float) * m.num_params());
  fresh.ZeroGrad();
  fresh.Forward(in.data(), tg.data(), 2, 8);
  fresh.Backward();
  EXPECT_EQ(std::memcmp(g1.data(), fresh.grads(), sizeof(float) * g1.size()), 0);
}

TEST(GptTest, ZeroGradIsVisibleThroughGrads) {
  Gpt m(Tiny());
  std::fill(m.grads(), m.grads() + m.num_params(), 1.0f);
  m.ZeroGrad();
  const float* g = m.grads();
  EXPECT_TRUE(std::all_of(g, g + m.num_params(), [](float x) { return x == 0.0f; }));
}

TEST(GptTest, FirstBackwardAfterZeroGradEqualsExplicitZeros) {
  Gpt m(Tiny());
  m.InitRandom(9);
  std::vector<int32_t> in(16), tg(16);
  for (int i = 0; i < 16; i++) {
    in[i] = (i * 5 + 2) % 37;
    tg[i] = (i * 13) % 37;
  }
  // Lazy path: garbage, ZeroGrad, Backward overwrites.
  std::fill(m.grads(), m.grads() + m.num_params(), 7.0f);
  m.ZeroGrad();
  m.Forward(in.data(), tg.data(), 2, 8);
  m.Backward();
  std::vector<float> lazy(m.grads(), m.grads() + m.num_params());
  // Eager path: real zeros (materialised by grads()), then an accumulating Backward.
  m.ZeroGrad();
  (void)m.grads();
  m.Forward(in.data(), tg.data(), 2, 8);
  m.Backward();
  EXPECT_EQ(std::memcmp(lazy.data(), m.grads(), sizeof(float) * lazy.size()), 0);
}

TEST(GptDeathTest, BackwardWithoutTargetsIsABrokenInvariant) {
  Gpt m(Tiny());
  std::vector<int32_t> in(4, 1);
  m.Forward(in.data(), nullptr, 1, 4);
  EXPECT_DEATH(m.Backward(), "Forward with targets");
}

}  // namespace
}  // namespace drover::engine
