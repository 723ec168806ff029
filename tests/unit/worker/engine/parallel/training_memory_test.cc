// The pure parts of data parallelism: how an arena is sharded over dp ranks and how
// gradient units are grouped into buckets.
#include "worker/engine/parallel/training_memory.h"

#include <gtest/gtest.h>

#include <numeric>

#include "tests/unit/worker/engine/emulated_device_ops.h"

namespace drover::engine::parallel {
namespace {

TEST(ShardPartitionTest, ShardsAreAlignedContiguousAndCoverTheArena) {
  for (size_t n : {0, 1, 15, 16, 17, 1000, 55488}) {
    for (int parts : {1, 2, 3, 4, 7}) {
      ShardPartition p(n, parts);
      EXPECT_EQ(p.shard % 16, 0u);
      size_t covered = 0;
      for (int r = 0; r < parts; ++r) {
        EXPECT_EQ(p.begin(r), std::min(n, covered)) << n << " " << parts << " " << r;
        if (p.begin(r) < n) {
          EXPECT_EQ(p.begin(r) % 16, 0u);
        }
        covered = p.end(r);
      }
      EXPECT_EQ(covered, n);
    }
  }
}

TEST(ShardPartitionTest, CountsAreTheIntersectionsWithEachShard) {
  ShardPartition p(100, 3);  // shards of 48: [0,48) [48,96) [96,100)
  EXPECT_EQ(p.Counts(0, 100), (std::vector<size_t>{48, 48, 4}));
  EXPECT_EQ(p.Counts(40, 50), (std::vector<size_t>{8, 2, 0}));
  EXPECT_EQ(p.Counts(97, 99), (std::vector<size_t>{0, 0, 2}));
}

std::vector<Unit> Units(std::vector<size_t> sizes) {
  std::vector<Unit> units;
  size_t offset = 0;
  for (size_t s : sizes) {
    units.push_back(Unit{UnitKind::kLayer, static_cast<int>(units.size()), offset, s});
    offset += s;
  }
  return units;
}

TEST(PlanBucketsTest, GroupsUnitsInBackwardOrderUntilTheBucketIsFull) {
  // Units 0..4 of sizes 10, 5, 5, 5, 20; buckets of at least 10 floats, from the last unit.
  const auto buckets = PlanBuckets(Units({10, 5, 5, 5, 20}), 10, {}, {});
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].units, (std::vector<int>{4}));
  EXPECT_EQ(buckets[1].units, (std::vector<int>{3, 2}));
  EXPECT_EQ(buckets[1].begin, 15u);
  EXPECT_EQ(buckets[1].end, 25u);
  EXPECT_EQ(buckets[2].units, (std::vector<int>{1, 0}));
  EXPECT_EQ(buckets[2].begin, 0u);
  EXPECT_EQ(buckets[2].end, 15u);
}

TEST(PlanBucketsTest, ExcludedUnitsSplitBucketsAndGetNone) {
  const auto buckets = PlanBuckets(Units({4, 4, 4, 4}), 100, {2}, {});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].units, (std::vector<int>{3}));
  EXPECT_EQ(buckets[1].units, (std::vector<int>{1, 0}));
  EXPECT_EQ(buckets[1].end, 8u);
}

// On the CPU the tied table is reduced during the layers' backward and the embedding's rows
// follow; on a device (where those rows would travel through host memory) the unit waits
// for the embedding's backward and is reduced whole (the emulated-device equivalence tests
// in parallel_gpt_test.cc take that path).
TEST(TiedUnitTest, ReadyAfterTheHeadOnHostMemoryOnlyAfterTheEmbeddingOnADevice) {
  EXPECT_TRUE(TiedUnitReadyAfterHeadOn(CpuOps()));
  testing::EmulatedDeviceOps device;
  EXPECT_FALSE(TiedUnitReadyAfterHeadOn(&device));
}

TEST(PlanBucketsTest, AloneUnitsGetABucketOfTheirOwn) {
  // The embedding (unit 0) of a single stage is ready first and reduced on its own.
  const auto buckets = PlanBuckets(Units({8, 4, 4, 2}), 100, {}, {0});
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].units, (std::vector<int>{3, 2, 1}));
  EXPECT_EQ(buckets[1].units, (std::vector<int>{0}));
  EXPECT_EQ(buckets[1].begin, 0u);
  EXPECT_EQ(buckets[1].end, 8u);
}

}  // namespace
}  // namespace drover::engine::parallel
