#include "worker/engine/model/gpt_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tests/unit/worker/engine/emulated_device_ops.h"

namespace drover::engine {
namespace {

// maxT 8, V 37 (Vp 128), L 2, NH 2, C 16: short enough that generation outgrows the window.
GptConfig Tiny() { return GptConfig{8, 37, 128, 2, 2, 16}; }

// Every logit of `got` against the full forward's, which recomputes the whole window.
void ExpectSameLogits(Gpt& model, const std::vector<int32_t>& context,
                      const std::vector<float>& got) {
  const std::vector<float> want =
      model.NextTokenLogits(context.data(), static_cast<int>(context.size()));
  ASSERT_EQ(got.size(), want.size());
  for (size_t v = 0; v < want.size(); ++v) {
    ASSERT_NEAR(got[v], want[v], 2e-5) << "token " << v << " after " << context.size();
  }
}

TEST(GptDecoderTest, EveryTokenMatchesTheFullForwardInsideAndBeyondTheWindow) {
  Gpt model(Tiny());
  model.InitRandom(7);
  GptDecoder decoder(model);
  std::vector<int32_t> context = {5};
  for (int step = 0; step < 20; ++step) {  // 20 tokens: the window (8) slides from step 8
    const std::vector<float> logits =
        decoder.NextTokenLogits(context.data(), static_cast<int>(context.size()));
    ExpectSameLogits(model, context, logits);
    // Inside the window each token after the first costs one row; beyond it, every token
    // shifts the window, and all of it is recomputed.
    EXPECT_EQ(decoder.cached(), std::min<int>(context.size(), 8));
    EXPECT_EQ(decoder.computed(), step == 0 ? 1 : context.size() <= 8 ? 1 : 8) << step;
    context.push_back((step * 13 + 3) % 37);
  }
}

TEST(GptDecoderTest, ADifferentContextIsRecomputedNotServedFromTheCache) {
  Gpt model(Tiny());
  model.InitRandom(8);
  GptDecoder decoder(model);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};
  const std::vector<int32_t> b = {1, 2, 9, 4, 5, 6};  // shares only a prefix of 2 with a
  const std::vector<int32_t> c = {1, 2, 9};           // a prefix of b: shorter than the cache
  const int computed[] = {5, 4, 1, 3};  // c runs its last token only: it is run, not cached
  int i = 0;
  for (const auto* context : {&a, &b, &c, &a}) {
    ExpectSameLogits(model, *context,
                     decoder.NextTokenLogits(context->data(), static_cast<int>(context->size())));
    EXPECT_EQ(decoder.computed(), computed[i++]);
  }
}

TEST(GptDecoderTest, APromptLongerThanTheWindowKeepsItsLastTokens) {
  Gpt model(Tiny());
  model.InitRandom(9);
  GptDecoder decoder(model);
  std::vector<int32_t> prompt(19);
  for (int i = 0; i < 19; ++i) prompt[i] = (i * 7 + 2) % 37;
  ExpectSameLogits(model, prompt, decoder.NextTokenLogits(prompt.data(), 19));
  EXPECT_EQ(decoder.cached(), 8);
}

// On a table whose memory is a device's (a host access to it faults: EmulatedDeviceOps) the
// parameters are copied in, the cache and the activations stay in its memory and only the
// logits come out: the CPU decoder's logits bit for bit (that table's arithmetic is the
// CPU's), through a prefill, tokens against the cache, a context that changes, and the window
// sliding past maxT.
TEST(GptDecoderTest, OnDeviceMemoryItGivesTheCpusLogits) {
  Gpt model(Tiny());
  model.InitRandom(10);
  testing::EmulatedDeviceOps device;
  GptDecoder cpu(model), dev(model, &device);
  std::vector<int32_t> context = {3, 1, 4, 1, 5};
  for (int step = 0; step < 14; ++step) {
    if (step == 6) context[2] = 9;  // the cache serves positions 0 and 1 only
    const int n = static_cast<int>(context.size());
    EXPECT_EQ(dev.NextTokenLogits(context.data(), n), cpu.NextTokenLogits(context.data(), n))
        << "step " << step;
    EXPECT_EQ(dev.computed(), cpu.computed());
    context.push_back((step * 5 + 2) % 37);
  }
}

// The table's decoder attention gives the rows of its full attention, from any row on, for
// one query or several.
TEST(GptDecoderTest, TheTablesDecoderAttentionGivesTheFullAttentionsRows) {
  const int T = 13, C = 16, NH = 2;
  std::vector<float> qkv(static_cast<size_t>(T) * 3 * C);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>((i * 37 % 101) - 50) / 25;
  std::vector<float> want(static_cast<size_t>(T) * C), att(static_cast<size_t>(NH) * T * T);
  CpuOps()->AttentionForward(want.data(), att.data(), qkv.data(), 1, T, C, NH, Precision::kFp32);
  for (auto [from, rows] : {std::pair{0, 1}, {0, T}, {12, 1}, {5, 8}, {7, 3}}) {
    // The sequence ends at the decoded rows: what comes after them is not read.
    std::vector<float> got(static_cast<size_t>(rows) * C);
    const std::vector<float> prefix(qkv.begin(), qkv.begin() + (from + rows) * 3 * C);
    CpuOps()->AttentionDecode(got.data(), prefix.data(), from, rows, C, NH);
    EXPECT_EQ(got, std::vector<float>(want.begin() + from * C, want.begin() + (from + rows) * C))
        << "rows " << from << ".." << from + rows - 1;
  }
}

}  // namespace
}  // namespace drover::engine
