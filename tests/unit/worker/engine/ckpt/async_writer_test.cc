// AsyncCheckpointWriter while the coordinator is away: a rank whose write in flight waits on
// it says so (WaitingOnCoordinator), and gives its part of the next checkpoint up rather
// than hold the training thread for the outage; without leave to give up it waits.
#include "worker/engine/ckpt/async_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/worker/engine/ckpt/checkpoint_test_util.h"
#include "worker/engine/ckpt/shard_exchange.h"
#include "worker/engine/publish_fence.h"

namespace drover::engine::ckpt {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// True once `done()` is, polled for up to 10 s.
bool Eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

class AsyncWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("async_writer_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  AsyncCheckpointWriter::Options Options(int rank, int world) {
    AsyncCheckpointWriter::Options o;
    o.dir = dir_.string();
    o.rank = rank;
    o.world_size = world;
    o.keep_last = 0;
    // A writer that waits the whole outage out ends its wait here: long enough to tell
    // from a Submit that returned at once.
    o.fence_timeout = std::chrono::seconds(20);
    o.on_complete = [this](const v1::CheckpointManifest& m, const std::string&) {
      completed_.push_back(m.step());
    };
    o.on_failure = [this, rank](int64_t step, const Status& st) {
      if (rank == 0) failures_.push_back(std::to_string(step) + ": " + st.ToString());
    };
    return o;
  }
  static ShardSnapshot Whole(int64_t step) {
    return PartOf(MakeSnapshot(step, 64), 0, {MakeRun(0, 64, 64, 1)});
  }

  fs::path dir_;
  std::vector<int64_t> completed_;  // the writer's thread appends; read after Flush
  std::vector<std::string> failures_;
};

// The coordinator goes away just as the checkpoint of step 10 waits for its confirmation:
// the next Submit, with leave to give up, returns while that write still waits, and its
// checkpoint (step 20) is abandoned, naming why; step 10 commits once the coordinator is back.
TEST_F(AsyncWriterTest, APartDueWhileTheWriteInFlightWaitsOnTheCoordinatorIsGivenUp) {
  AwayFence fence;
  fence.away = true;
  AsyncCheckpointWriter::Options o = Options(0, 1);
  o.fence = &fence;
  AsyncCheckpointWriter writer(o);
  EXPECT_FALSE(writer.WaitingOnCoordinator());
  ASSERT_TRUE(writer.Submit(Whole(10)).ok());
  ASSERT_TRUE(Eventually([&] { return writer.WaitingOnCoordinator(); }));

  ASSERT_TRUE(writer.Submit(Whole(20), /*may_give_up=*/true).ok());
  EXPECT_TRUE(writer.WaitingOnCoordinator()) << "Submit waited for the write on the coordinator";
  EXPECT_TRUE(writer.InFlightFor().has_value());

  fence.away = false;
  EXPECT_FALSE(writer.Flush().ok());  // step 20's part was given up
  EXPECT_FALSE(writer.WaitingOnCoordinator());
  EXPECT_EQ(completed_, (std::vector<int64_t>{10}));
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_THAT(failures_[0], ::testing::StartsWith("20: "));
  EXPECT_THAT(failures_[0],
              ::testing::HasSubstr("rank 0 gave its part up: its checkpoint of step 10 was still "
                                   "waiting on the coordinator"));
  EXPECT_TRUE(fs::exists(dir_ / "step_10"));
  EXPECT_FALSE(fs::exists(dir_ / "step_20"));
  EXPECT_FALSE(fs::exists(dir_ / TmpDirName(20, 0)));
  // The next checkpoint is written as usual.
  ASSERT_TRUE(writer.Submit(Whole(30), /*may_give_up=*/true).ok());
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(completed_, (std::vector<int64_t>{10, 30}));
}

// Without leave to give up (the final checkpoint), Submit waits for the write on the
// coordinator, and both checkpoints commit once it is back.
TEST_F(AsyncWriterTest, WithoutLeaveToGiveUpSubmitWaitsForTheCoordinator) {
  AwayFence fence;
  fence.away = true;
  AsyncCheckpointWriter::Options o = Options(0, 1);
  o.fence = &fence;
  AsyncCheckpointWriter writer(o);
  ASSERT_TRUE(writer.Submit(Whole(10)).ok());
  ASSERT_TRUE(Eventually([&] { return writer.WaitingOnCoordinator(); }));
  std::atomic<bool> submitted{false};
  std::thread final_save([&] {
    EXPECT_TRUE(writer.Submit(Whole(20)).ok());
    submitted = true;
  });
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(submitted);
  fence.away = false;
  final_save.join();
  ASSERT_TRUE(writer.Flush().ok());
  EXPECT_EQ(completed_, (std::vector<int64_t>{10, 20}));
  EXPECT_TRUE(failures_.empty());
}

// Two ranks; rank 1's report of step 10 cannot reach the store (the coordinator is away):
// rank 1 gives its part of step 20 up, and once the store is back rank 0 commits step 10
// and abandons step 20, naming rank 1's reason.
TEST_F(AsyncWriterTest, ARankWhoseReportWaitsOnTheStoreGivesItsNextPartUp) {
  AwayKvStore store;
  KvShardExchange exchange0(&store, std::chrono::seconds(20), nullptr);
  KvShardExchange exchange1(&store, std::chrono::seconds(20), nullptr);
  AsyncCheckpointWriter::Options o0 = Options(0, 2);
  o0.exchange = &exchange0;
  AsyncCheckpointWriter::Options o1 = Options(1, 2);
  o1.exchange = &exchange1;
  const auto halves = [](int64_t step, int rank) {
    return PartOf(MakeSnapshot(step, 64), rank, {MakeRun(rank * 32, 32, 64, 1)});
  };
  {
    AsyncCheckpointWriter rank0(o0);
    AsyncCheckpointWriter rank1(o1);
    store.away_sets = 1000000;
    ASSERT_TRUE(rank1.Submit(halves(10, 1)).ok());
    ASSERT_TRUE(Eventually([&] { return rank1.WaitingOnCoordinator(); }));
    ASSERT_TRUE(rank0.Submit(halves(10, 0)).ok());
    ASSERT_TRUE(rank1.Submit(halves(20, 1), /*may_give_up=*/true).ok());
    EXPECT_TRUE(rank1.WaitingOnCoordinator());
    EXPECT_FALSE(rank0.WaitingOnCoordinator());  // it waits for a peer, not the store
    store.away_sets = 0;
    ASSERT_TRUE(rank0.Submit(halves(20, 0), /*may_give_up=*/true).ok());
    EXPECT_FALSE(rank0.Flush().ok());
    EXPECT_FALSE(rank1.Flush().ok());
  }
  EXPECT_EQ(completed_, (std::vector<int64_t>{10}));
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_THAT(failures_[0], ::testing::StartsWith("20: "));
  EXPECT_THAT(failures_[0], ::testing::HasSubstr("rank 1 could not write its shard"));
  EXPECT_THAT(failures_[0], ::testing::HasSubstr("rank 1 gave its part up"));
  EXPECT_TRUE(fs::exists(dir_ / "step_10"));
  EXPECT_FALSE(fs::exists(dir_ / TmpDirName(20, 0)));
}

}  // namespace
}  // namespace drover::engine::ckpt
