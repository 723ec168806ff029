// KvShardExchange over a store that is away a while, as the coordinator's rendezvous
// service is while the coordinator restarts: a shard report is neither lost nor given up
// for it.
#include "worker/engine/ckpt/shard_exchange.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/worker/engine/ckpt/checkpoint_test_util.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::ckpt {
namespace {

using std::chrono::milliseconds;

std::vector<v1::CheckpointShard> Entries(const std::string& file) {
  v1::CheckpointShard shard;
  shard.set_file(file);
  shard.set_bytes(64);
  return {shard};
}

// Rank 1's report made while the store is away is sent again until it lands, and rank 0
// collects it: before, the report was lost, and rank 0 waited for it for the whole timeout
// (10 minutes in the trainer) with no checkpoint committed.
TEST(ShardExchangeTest, AReportMadeWhileTheStoreIsAwayIsSentAgainUntilItLands) {
  AwayKvStore store;
  store.away_sets = 3;
  KvShardExchange rank1(&store, std::chrono::seconds(30), nullptr);
  ASSERT_TRUE(rank1.Publish(7, 1, Entries("params.r1.bin")).ok());
  EXPECT_EQ(store.sets.load(), 4);
  KvShardExchange rank0(&store, std::chrono::seconds(30), nullptr);
  auto got = rank0.Collect(7, 2);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].file(), "params.r1.bin");
}

// Rank 0 waits for the report through the store's absence rather than failing the
// checkpoint at its first Unavailable: the report may come once the coordinator is back.
TEST(ShardExchangeTest, ACollectWaitsThroughTheStoresAbsence) {
  AwayKvStore store;
  store.away_gets = 4;
  KvShardExchange rank0(&store, std::chrono::seconds(30), nullptr);
  std::thread rank1([&] {
    std::this_thread::sleep_for(milliseconds(300));
    KvShardExchange exchange(&store, std::chrono::seconds(30), nullptr);
    EXPECT_TRUE(exchange.Publish(9, 1, Entries("adam_m.r1.bin")).ok());
  });
  auto got = rank0.Collect(9, 2);
  rank1.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].file(), "adam_m.r1.bin");
  EXPECT_GE(store.gets.load(), 5);
}

// A store away for longer than the exchange's timeout: both sides give up with its error,
// and a stop request ends the retries at once.
TEST(ShardExchangeTest, AStoreAwayPastTheTimeoutFailsBothSidesNamingIt) {
  AwayKvStore store;
  store.away_sets = 1000000;
  store.away_gets = 1000000;
  KvShardExchange exchange(&store, milliseconds(300), nullptr);
  const auto start = std::chrono::steady_clock::now();
  const Status published = exchange.Publish(3, 1, Entries("params.r1.bin"));
  EXPECT_EQ(published.code(), StatusCode::kUnavailable) << published;
  auto collected = exchange.Collect(3, 2);
  EXPECT_EQ(collected.status().code(), StatusCode::kUnavailable) << collected.status();
  EXPECT_NE(collected.status().message().find("checkpoint shards of step 3"), std::string::npos)
      << collected.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  std::atomic<bool> stop{true};
  KvShardExchange stopped(&store, std::chrono::seconds(60), &stop);
  const int before = store.sets.load();
  EXPECT_EQ(stopped.Publish(3, 1, Entries("params.r1.bin")).code(), StatusCode::kUnavailable);
  EXPECT_EQ(store.sets.load(), before + 1);
  EXPECT_EQ(stopped.Collect(3, 2).status().code(), StatusCode::kCancelled);
}

// Unreachable() says the exchange waits on the store's absence, and only that: a Collect
// waiting for a peer that has not reported yet is not unreachable, and neither is an
// exchange whose Publish landed.
TEST(ShardExchangeTest, ItIsUnreachableOnlyWhileItsStoreIsAway) {
  AwayKvStore store;
  store.away_sets = 1000000;
  KvShardExchange rank1(&store, std::chrono::seconds(30), nullptr);
  EXPECT_FALSE(rank1.Unreachable());
  std::thread publish([&] { EXPECT_TRUE(rank1.Publish(4, 1, Entries("params.r1.bin")).ok()); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!rank1.Unreachable() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_TRUE(rank1.Unreachable());
  store.away_sets = 0;
  publish.join();
  EXPECT_FALSE(rank1.Unreachable());

  KvShardExchange rank0(&store, milliseconds(600), nullptr);
  std::atomic<bool> seen_unreachable{false};
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) seen_unreachable = seen_unreachable || rank0.Unreachable();
  });
  EXPECT_EQ(rank0.Collect(4, 3).status().code(), StatusCode::kDeadlineExceeded);  // no rank 2
  done = true;
  watch.join();
  EXPECT_FALSE(seen_unreachable);
}

// The store restarts (the coordinator's rendezvous service keeps its keys in memory) after
// rank 1 reported step 5: rank 0 finds its mark gone, and gives the checkpoint up once no
// report came within after_restart, naming the lost report, rather than wait for it until
// its timeout (10 minutes in the trainer) with every later checkpoint deferred meanwhile.
TEST(ShardExchangeTest, AReportLostToARestartedStoreFailsTheCheckpointSoonNamingIt) {
  AwayKvStore store;
  KvShardExchange rank0(&store, std::chrono::seconds(60), nullptr, milliseconds(300));
  ASSERT_TRUE(rank0.MarkStore().ok());
  KvShardExchange rank1(&store, std::chrono::seconds(60), nullptr);
  ASSERT_TRUE(rank1.Publish(5, 1, Entries("params.r1.bin")).ok());
  store.Restart();
  const auto start = std::chrono::steady_clock::now();
  auto got = rank0.Collect(5, 2);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status();
  EXPECT_NE(got.status().message().find(
                "rank 1's report of its checkpoint shard of step 5 was lost when the "
                "coordinator restarted"),
            std::string::npos)
      << got.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // The mark is placed again: the next checkpoint is collected as usual.
  ASSERT_TRUE(rank1.Publish(6, 1, Entries("params.r1.bin")).ok());
  EXPECT_TRUE(rank0.Collect(6, 2).ok());
}

// Reports made after the restart are not lost: a checkpoint whose ranks were still writing,
// or still trying to reach the store, when it restarted completes.
TEST(ShardExchangeTest, AReportMadeAfterTheStoreRestartedStillCompletesTheCheckpoint) {
  AwayKvStore store;
  KvShardExchange rank0(&store, std::chrono::seconds(60), nullptr, std::chrono::seconds(20));
  ASSERT_TRUE(rank0.MarkStore().ok());
  store.Restart();
  std::thread rank1([&] {
    std::this_thread::sleep_for(milliseconds(500));
    KvShardExchange exchange(&store, std::chrono::seconds(30), nullptr);
    EXPECT_TRUE(exchange.Publish(7, 1, Entries("adam_v.r1.bin")).ok());
  });
  auto got = rank0.Collect(7, 2);
  rank1.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].file(), "adam_v.r1.bin");
}

}  // namespace
}  // namespace drover::engine::ckpt
