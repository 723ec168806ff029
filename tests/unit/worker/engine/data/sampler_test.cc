#include "worker/engine/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace drover::engine {
namespace {

BatchLayout Layout(int global, int micro, int rank, int size) {
  BatchLayout l;
  l.global_batch = global;
  l.micro_batch = micro;
  l.dp_rank = rank;
  l.dp_size = size;
  return l;
}

TEST(SamplerTest, EachEpochIsAPermutationAndEpochsDiffer) {
  for (uint64_t n : {1ull, 2ull, 5ull, 17ull, 64ull, 1000ull}) {
    Sampler s(n, 1337, true, Layout(1, 1, 0, 1));
    std::vector<uint64_t> e0, e1;
    for (uint64_t i = 0; i < n; ++i) e0.push_back(s.WindowOf(i));
    for (uint64_t i = 0; i < n; ++i) e1.push_back(s.WindowOf(n + i));
    std::vector<uint64_t> sorted = e0;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i) << "n=" << n;
    std::sort(e1.begin(), e1.end());
    EXPECT_EQ(e1, sorted);
    if (n >= 17) {
      std::vector<uint64_t> again;
      for (uint64_t i = 0; i < n; ++i) again.push_back(s.WindowOf(n + i));
      EXPECT_NE(again, e0) << "epoch 1 repeats epoch 0's order, n=" << n;
    }
  }
}

TEST(SamplerTest, DeterministicForASeedAndDifferentAcrossSeeds) {
  Sampler a(1000, 7, true, Layout(1, 1, 0, 1));
  Sampler b(1000, 7, true, Layout(1, 1, 0, 1));
  Sampler c(1000, 8, true, Layout(1, 1, 0, 1));
  int same = 0;
  for (uint64_t i = 0; i < 3000; ++i) {
    EXPECT_EQ(a.WindowOf(i), b.WindowOf(i));
    same += a.WindowOf(i) == c.WindowOf(i);
  }
  EXPECT_LT(same, 30);
  // Shuffled, not the identity.
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += a.WindowOf(i) == i;
  EXPECT_LT(fixed, 20);
}

TEST(SamplerTest, SequentialModeIsLlmcOrderAndWrapsAtEpochEnd) {
  Sampler s(5, 1, false, Layout(4, 2, 0, 1));
  EXPECT_EQ(s.NextMicroBatch(), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(s.NextMicroBatch(), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(s.NextMicroBatch(), (std::vector<uint64_t>{4, 0}));  // wraps into epoch 1
  const SamplerState st = s.state();
  EXPECT_EQ(st.consumed_samples, 4u);
  EXPECT_EQ(st.micro_step, 1);
  s.NextMicroBatch();
  EXPECT_EQ(s.state().epoch, 1u);
  EXPECT_EQ(s.state().offset, 3u);
  EXPECT_EQ(s.state().consumed_samples, 8u);
  EXPECT_EQ(s.state().micro_step, 0);
}

// All samples one world size sees in `steps` optimizer steps, per step, as a multiset.
std::vector<std::multiset<uint64_t>> GlobalBatches(uint64_t n, int global, int micro, int world,
                                                   int steps, uint64_t start_consumed = 0) {
  std::vector<Sampler> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back(n, 99, true, Layout(global, micro, r, world));
    SamplerState st;
    st.consumed_samples = start_consumed;
    st.epoch = start_consumed / n;
    st.offset = start_consumed % n;
    EXPECT_TRUE(ranks.back().Restore(st).ok());
  }
  std::vector<std::multiset<uint64_t>> out(steps);
  for (int k = 0; k < steps; ++k) {
    for (Sampler& s : ranks) {
      for (int a = 0; a < s.layout().accum_steps(); ++a) {
        for (uint64_t w : s.NextMicroBatch()) out[k].insert(w);
      }
    }
  }
  return out;
}

TEST(SamplerTest, WorldSizesWithTheSameGlobalBatchSeeTheSameSamples) {
  const uint64_t n = 37;  // not a multiple of the batch: steps straddle epoch ends
  const auto w1 = GlobalBatches(n, 8, 2, 1, 12);  // 4 accumulation steps
  const auto w2 = GlobalBatches(n, 8, 2, 2, 12);  // 2
  const auto w4 = GlobalBatches(n, 8, 1, 4, 12);  // 2, micro 1
  const auto w8 = GlobalBatches(n, 8, 1, 8, 12);  // 1
  EXPECT_EQ(w1, w2);
  EXPECT_EQ(w1, w4);
  EXPECT_EQ(w1, w8);
}

TEST(SamplerTest, RanksTakeDisjointContiguousSlicesOfTheGlobalBatch) {
  Sampler single(100, 5, true, Layout(8, 8, 0, 1));
  const std::vector<uint64_t> all = single.NextMicroBatch();
  Sampler r0(100, 5, true, Layout(8, 2, 0, 2));
  Sampler r1(100, 5, true, Layout(8, 2, 1, 2));
  std::vector<uint64_t> seen;
  for (Sampler* s : {&r0, &r1}) {
    for (int a = 0; a < 2; ++a) {
      for (uint64_t w : s->NextMicroBatch()) seen.push_back(w);
    }
  }
  EXPECT_EQ(seen, all);
  EXPECT_EQ(r0.state().consumed_samples, 8u);
  EXPECT_EQ(r1.state().consumed_samples, 8u);
}

TEST(SamplerTest, RestoreAtAnotherWorldSizeContinuesTheGlobalStream) {
  const uint64_t n = 29;
  // Reference: world 1 trains 10 steps.
  const auto ref = GlobalBatches(n, 6, 3, 1, 10);
  // World 2 trains 4 steps, "checkpoints", world 3 resumes for the remaining 6.
  Sampler ckpt(n, 99, true, Layout(6, 3, 0, 2));
  for (int i = 0; i < 4; ++i) ckpt.NextMicroBatch();
  const SamplerState saved = ckpt.state();
  EXPECT_EQ(saved.consumed_samples, 24u);
  const auto resumed = GlobalBatches(n, 6, 2, 3, 6, saved.consumed_samples);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(resumed[k], ref[4 + k]) << "step " << 4 + k;
}

TEST(SamplerTest, SaveRestoreMidStepInTheSameLayout) {
  Sampler a(50, 3, true, Layout(12, 2, 1, 2));
  for (int i = 0; i < 7; ++i) a.NextMicroBatch();
  Sampler b(50, 3, true, Layout(12, 2, 1, 2));
  ASSERT_TRUE(b.Restore(a.state()).ok());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.NextMicroBatch(), b.NextMicroBatch());
}

TEST(SamplerTest, RestoreRejectsAStateFromAnotherDatasetOrLayout) {
  Sampler s(50, 3, true, Layout(12, 2, 0, 2));
  SamplerState st;
  st.consumed_samples = 60;
  st.epoch = 1;
  st.offset = 10;
  EXPECT_TRUE(s.Restore(st).ok());
  st.offset = 11;
  const Status bad = s.Restore(st);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("50 windows"), std::string::npos);
  st.offset = 10;
  st.micro_step = 3;  // this layout has 3 micro-steps: 0..2
  EXPECT_EQ(s.Restore(st).code(), StatusCode::kInvalidArgument);
}

TEST(BatchLayoutTest, ValidateNamesTheFactors) {
  EXPECT_TRUE(Layout(12, 3, 1, 2).Validate().ok());
  const Status st = Layout(12, 5, 0, 2).Validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("train.global_batch = 12"), std::string::npos);
  EXPECT_NE(st.message().find("train.micro_batch (5)"), std::string::npos);
  EXPECT_FALSE(Layout(12, 3, 2, 2).Validate().ok());
  EXPECT_FALSE(Layout(0, 1, 0, 1).Validate().ok());
}

}  // namespace
}  // namespace drover::engine
