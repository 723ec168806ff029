#include "worker/engine/kernels/cuda/token_buckets.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

namespace drover::engine::cuda {
namespace {

// The packed layout, read back, lists every id's occurrences in order, each once.
TEST(TokenBucketsTest, ListsEachIdsPositionsInOrder) {
  std::mt19937 rng(11);
  TokenBuckets buckets;
  for (int n : {1, 7, 300}) {
    std::vector<int32_t> ids(n);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % 40) * 3;  // gaps between ids
    ids[0] = 0;
    buckets.Build(ids.data(), n);
    std::map<int32_t, std::vector<int32_t>> want;
    for (int i = 0; i < n; ++i) want[ids[i]].push_back(i);

    ASSERT_EQ(buckets.count(), n);
    ASSERT_EQ(buckets.distinct(), static_cast<int>(want.size()));
    const int U = buckets.distinct();
    const std::vector<int32_t>& p = buckets.packed();
    ASSERT_EQ(p.size(), static_cast<size_t>(2 * U + 1 + n));
    const int32_t* id = p.data();
    const int32_t* start = id + U;
    const int32_t* position = start + U + 1;
    EXPECT_EQ(start[0], 0);
    EXPECT_EQ(start[U], n);
    int j = 0;
    for (const auto& [v, positions] : want) {
      ASSERT_EQ(id[j], v) << "n " << n;
      EXPECT_EQ(std::vector<int32_t>(position + start[j], position + start[j + 1]), positions)
          << "id " << v;
      ++j;
    }
  }
}

// Under a vocabulary split, ids of -1 (tokens of another rank's slice) add no row: they are
// in no bucket, and only the other ids' positions are listed.
TEST(TokenBucketsTest, LeavesOutTheIdsOfAnotherRanksSlice) {
  TokenBuckets buckets;
  const std::vector<int32_t> ids = {-1, 4, -1, 0, 4, -1};
  buckets.Build(ids.data(), static_cast<int>(ids.size()));
  ASSERT_EQ(buckets.distinct(), 2);
  EXPECT_EQ(buckets.packed(), (std::vector<int32_t>{0, 4, 0, 1, 3, 3, 1, 4}));
  const std::vector<int32_t> none = {-1, -1};
  buckets.Build(none.data(), 2);
  EXPECT_EQ(buckets.distinct(), 0);
  EXPECT_EQ(buckets.packed(), (std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace drover::engine::cuda
