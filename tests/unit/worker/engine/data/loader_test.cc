#include "worker/engine/data/loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "common/token_shard.h"

namespace drover::engine {
namespace {

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/drover_loader_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // Two shards of distinct tokens: 0..1000 and 20000..20500.
    std::vector<uint16_t> a(1001), b(501);
    std::iota(a.begin(), a.end(), 0);
    std::iota(b.begin(), b.end(), 20000);
    ASSERT_TRUE(WriteTokenShard(dir_ + "/train_000000.bin", a).ok());
    ASSERT_TRUE(WriteTokenShard(dir_ + "/train_000001.bin", b).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::shared_ptr<const TokenDataset> Open(int T) {
    auto ds = TokenDataset::Open(dir_ + "/train_*.bin", T);
    EXPECT_TRUE(ds.ok()) << ds.status();
    return std::shared_ptr<const TokenDataset>(std::move(ds).value());
  }

  static DataLoaderOptions Options(int global, int micro, int rank = 0, int size = 1) {
    DataLoaderOptions o;
    o.layout = {global, micro, rank, size};
    o.seed = 42;
    o.prefetch = 3;
    return o;
  }

  std::string dir_;
};

TEST_F(LoaderTest, PrefetchedBatchesFollowTheSamplerInOrder) {
  const int T = 16, B = 4;
  auto ds = Open(T);
  auto loader = DataLoader::Create(ds, Options(8, B));
  ASSERT_TRUE(loader.ok()) << loader.status();
  Sampler reference(ds->num_windows(), 42, true, BatchLayout{8, B, 0, 1});
  std::vector<int32_t> in(B * T), tg(B * T), want_in(T), want_tg(T);
  for (int step = 0; step < 50; ++step) {  // > 1 epoch of 93 windows
    ASSERT_TRUE((*loader)->Next(in.data(), tg.data()).ok());
    const std::vector<uint64_t> windows = reference.NextMicroBatch();
    for (int b = 0; b < B; ++b) {
      ds->ReadWindow(windows[b], want_in.data(), want_tg.data());
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[b * T + t], want_in[t]) << "batch " << step << " row " << b;
        ASSERT_EQ(tg[b * T + t], want_tg[t]) << "batch " << step << " row " << b;
      }
    }
    // The position is the sampler's after this batch, not after the prefetched ones.
    const SamplerState st = (*loader)->state();
    EXPECT_EQ(st.consumed_samples, reference.state().consumed_samples);
    EXPECT_EQ(st.micro_step, reference.state().micro_step);
  }
  EXPECT_EQ((*loader)->batches(), 50);
  EXPECT_GE((*loader)->total_wait_s(), (*loader)->last_wait_s());
  EXPECT_GE((*loader)->last_wait_s(), 0.0);
}

TEST_F(LoaderTest, TargetsAreInputsShiftedByOne) {
  const int T = 8, B = 3;
  auto loader = DataLoader::Create(Open(T), Options(3, B));
  ASSERT_TRUE(loader.ok());
  std::vector<int32_t> in(B * T), tg(B * T);
  ASSERT_TRUE((*loader)->Next(in.data(), tg.data()).ok());
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t + 1 < T; ++t) EXPECT_EQ(tg[b * T + t], in[b * T + t + 1]);
    EXPECT_EQ(tg[b * T + T - 1], in[b * T + T - 1] + 1);  // the tokens count up
  }
}

TEST_F(LoaderTest, RestoreResumesExactlyFromAHandedOutState) {
  const int T = 16, B = 2;
  auto ds = Open(T);
  auto a = DataLoader::Create(ds, Options(4, B));
  ASSERT_TRUE(a.ok());
  std::vector<int32_t> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
  for (int i = 0; i < 7; ++i) ASSERT_TRUE((*a)->Next(in.data(), tg.data()).ok());
  const SamplerState saved = (*a)->state();
  // A fresh loader started from the saved state, and the old one restored to it after
  // running ahead, both continue with what `a` would have produced next.
  auto b = DataLoader::Create(ds, Options(4, B), saved);
  ASSERT_TRUE(b.ok());
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*a)->Next(in.data(), tg.data()).ok());
    ASSERT_TRUE((*b)->Next(in2.data(), tg2.data()).ok());
    EXPECT_EQ(in, in2);
    EXPECT_EQ(tg, tg2);
    expected.push_back(in);
  }
  ASSERT_TRUE((*a)->Restore(saved).ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*a)->Next(in.data(), tg.data()).ok());
    EXPECT_EQ(in, expected[i]);
  }
}

TEST_F(LoaderTest, RejectsBadOptionsAndStates) {
  auto ds = Open(16);
  DataLoaderOptions o = Options(4, 3);
  EXPECT_EQ(DataLoader::Create(ds, o).status().code(), StatusCode::kInvalidArgument);
  o = Options(4, 2);
  o.prefetch = 0;
  EXPECT_EQ(DataLoader::Create(ds, o).status().code(), StatusCode::kInvalidArgument);
  SamplerState bad;
  bad.consumed_samples = 5;  // epoch/offset (0, 0) disagree
  EXPECT_EQ(DataLoader::Create(ds, Options(4, 2), bad).status().code(),
            StatusCode::kInvalidArgument);
  // A failed Restore leaves the loader usable where it was.
  auto loader = DataLoader::Create(ds, Options(4, 2));
  ASSERT_TRUE(loader.ok());
  std::vector<int32_t> in(32), tg(32);
  ASSERT_TRUE((*loader)->Next(in.data(), tg.data()).ok());
  EXPECT_FALSE((*loader)->Restore(bad).ok());
  EXPECT_EQ((*loader)->state().micro_step, 1);
  ASSERT_TRUE((*loader)->Next(in.data(), tg.data()).ok());
  EXPECT_EQ((*loader)->state().consumed_samples, 4u);
}

TEST_F(LoaderTest, DestroysCleanlyWithAFullQueue) {
  for (int i = 0; i < 20; ++i) {
    auto loader = DataLoader::Create(Open(16), Options(2, 2));
    ASSERT_TRUE(loader.ok());
  }
}

TEST_F(LoaderTest, EvalBatchesAreLlmcSequentialChunksPerShard) {
  const int B = 4, T = 30;  // chunks of 121 tokens advancing by 120
  auto eval = EvalLoader::Create(Open(T), B, T);
  ASSERT_TRUE(eval.ok()) << eval.status();
  // Shard 0 (1001 tokens): starts 0..840 (840 + 121 <= 1001) = 8; shard 1 (501): 4.
  EXPECT_EQ((*eval)->num_batches(), 12);
  std::vector<int32_t> in(B * T), tg(B * T);
  ASSERT_TRUE((*eval)->Batch(0, in.data(), tg.data()).ok());
  for (int i = 0; i < B * T; ++i) {
    EXPECT_EQ(in[i], i);
    EXPECT_EQ(tg[i], i + 1);
  }
  ASSERT_TRUE((*eval)->Batch(7, in.data(), tg.data()).ok());
  EXPECT_EQ(in[0], 840);
  EXPECT_EQ(tg[B * T - 1], 960);
  ASSERT_TRUE((*eval)->Batch(8, in.data(), tg.data()).ok());  // first batch of the second shard
  EXPECT_EQ(in[0], 20000);
  ASSERT_TRUE((*eval)->Batch(11, in.data(), tg.data()).ok());
  EXPECT_EQ(in[0], 20360);
  EXPECT_EQ(tg[B * T - 1], 20480);
}

TEST_F(LoaderTest, BatchesCheckTokenIdsAgainstTheVocabularyAsTheyAreRead) {
  const int T = 16, B = 2;
  // A vocabulary of 25000 holds both shards; 900 only the start of the first.
  auto ok_opts = Options(B, B);
  ok_opts.vocab_size = 25000;
  auto fine = DataLoader::Create(Open(T), ok_opts);
  ASSERT_TRUE(fine.ok());
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE((*fine)->Next(in.data(), tg.data()).ok()) << i;

  auto small = Options(B, B);
  small.vocab_size = 900;
  auto loader = DataLoader::Create(Open(T), small);
  ASSERT_TRUE(loader.ok());
  Status first_bad;
  for (int i = 0; i < 60 && first_bad.ok(); ++i) first_bad = (*loader)->Next(in.data(), tg.data());
  EXPECT_EQ(first_bad.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(first_bad.message(), ::testing::ContainsRegex("has token id [0-9]+ at token [0-9]+, "
                                                            "but model.vocab_size is 900"));

  auto eval = EvalLoader::Create(Open(30), 4, 30, /*vocab_size=*/900);
  ASSERT_TRUE(eval.ok());
  std::vector<int32_t> ein(4 * 30), etg(4 * 30);
  EXPECT_TRUE((*eval)->Batch(0, ein.data(), etg.data()).ok());  // tokens 0..120
  Status bad = (*eval)->Batch(7, ein.data(), etg.data());       // tokens 840..960
  EXPECT_EQ(bad.message(), "shard " + dir_ + "/train_000000.bin has token id 900 at token 900, " +
                               "but model.vocab_size is 900");
}

TEST_F(LoaderTest, EvalNeedsOneCompleteBatch) {
  auto eval = EvalLoader::Create(Open(16), 10, 101);
  ASSERT_FALSE(eval.ok());
  EXPECT_NE(eval.status().message().find("1011 consecutive tokens"), std::string::npos)
      << eval.status();
  EXPECT_NE(eval.status().message().find("largest shard has 1001"), std::string::npos);
  EXPECT_FALSE(EvalLoader::Create(Open(16), 0, 8).ok());
}

}  // namespace
}  // namespace drover::engine
