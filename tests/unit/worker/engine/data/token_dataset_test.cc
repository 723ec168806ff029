#include "worker/engine/data/token_dataset.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "common/token_shard.h"

namespace drover::engine {
namespace {

class TokenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/drover_dataset_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A shard whose tokens are first, first+1, ... (so a token says where it came from).
  void Shard(const std::string& name, uint16_t first, size_t n) {
    std::vector<uint16_t> t(n);
    std::iota(t.begin(), t.end(), first);
    ASSERT_TRUE(WriteTokenShard(dir_ + "/" + name, t).ok());
  }

  std::string dir_;
};

TEST_F(TokenDatasetTest, WindowsOfTPlusOneNeverCrossShards) {
  Shard("train_000001.bin", 1000, 10);  // T=4: windows at 0, 4 (8 needs 13 tokens)
  Shard("train_000000.bin", 0, 9);      // listed first by path: windows at 0, 4
  Shard("train_000002.bin", 2000, 4);   // too short for a window
  Shard("train_000003.bin", 3000, 5);   // one window
  auto ds = TokenDataset::Open(dir_ + "/train_*.bin", 4);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_shards(), 4u);
  EXPECT_EQ((*ds)->num_tokens(), 28u);
  EXPECT_EQ((*ds)->num_windows(), 5u);
  const std::vector<int> first_token = {0, 4, 1000, 1004, 3000};
  std::vector<int32_t> in(4), tg(4);
  for (uint64_t w = 0; w < 5; ++w) {
    (*ds)->ReadWindow(w, in.data(), tg.data());
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(in[t], first_token[w] + t) << "window " << w;
      EXPECT_EQ(tg[t], first_token[w] + t + 1) << "window " << w;
    }
  }
  size_t shard = 0;
  uint64_t token = 0;
  (*ds)->WindowStart(4, &shard, &token);
  EXPECT_EQ(shard, 3u);
  EXPECT_EQ(token, 0u);
}

TEST_F(TokenDatasetTest, SinglePathWithoutGlob) {
  Shard("val.bin", 7, 100);
  auto ds = TokenDataset::Open(dir_ + "/val.bin", 8);
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ((*ds)->num_windows(), 12u);  // (100 - 1) / 8
}

TEST_F(TokenDatasetTest, ErrorsNameThePatternOrFile) {
  auto none = TokenDataset::Open(dir_ + "/missing_*.bin", 4);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("missing_*.bin"), std::string::npos);

  Shard("small.bin", 0, 3);
  auto small = TokenDataset::Open(dir_ + "/small.bin", 4);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);

  const std::string bad = dir_ + "/bad.bin";
  Shard("bad.bin", 0, 50);
  std::filesystem::resize_file(bad, 1024 + 60);
  auto corrupt = TokenDataset::Open(bad, 4);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(corrupt.status().message().find(bad), std::string::npos);

  EXPECT_EQ(TokenDataset::Open(dir_ + "/small.bin", 0).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace drover::engine
