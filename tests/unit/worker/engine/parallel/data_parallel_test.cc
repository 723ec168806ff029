// worker/engine/parallel/data_parallel.h and zero_sharded.h: where the dp reductions and
// gathers they hand to their CommStream take their compute marks (communicator.h,
// MarkCompute). On NCCL a call without one waits for everything enqueued when the stream's
// thread makes it, on a GPU most of backward; so every such call must follow a mark, taken
// on the training thread when the call was handed over.
#include "worker/engine/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "tests/unit/worker/engine/parallel/fake_group.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/kernels/profiled_ops.h"
#include "worker/engine/parallel/zero_sharded.h"

namespace drover::engine::parallel {
namespace {

// A dp group of two whose collectives leave the data as it is and record the mark each
// followed (FollowMark's, or null); its marks are fresh objects, each holding what `stamp`
// said when it was taken (0 without one).
class MarkRecordingGroup final : public testing::FakeGroup {
 public:
  struct Call {
    const char* op;
    std::shared_ptr<const ComputeMark> mark;
  };

  struct StampedMark final : ComputeMark {
    explicit StampedMark(int64_t s) : stamp(s) {}
    const int64_t stamp;
  };

  explicit MarkRecordingGroup(std::function<int64_t()> stamp = nullptr)
      : FakeGroup("dp", 2), stamp_(std::move(stamp)) {}

  Status AllReduce(void*, size_t, DataType, ReduceOp) override { return Record("AllReduce"); }
  Status ReduceScatter(void*, std::span<const size_t>, DataType, ReduceOp) override {
    return Record("ReduceScatter");
  }
  Status AllGather(void*, std::span<const size_t>, DataType) override {
    return Record("AllGather");
  }
  Status Broadcast(void*, size_t, DataType, int) override { return Record("Broadcast"); }
  Status Barrier() override { return Record("Barrier"); }

  std::shared_ptr<const ComputeMark> MarkCompute() override {
    return std::make_shared<StampedMark>(stamp_ ? stamp_() : 0);
  }
  void FollowMark(std::shared_ptr<const ComputeMark> mark) override { mark_ = std::move(mark); }

  std::vector<Call> calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }

 private:
  // On the stream's thread; calls() on the test's.
  Status Record(const char* op) {
    MutexLock lock(&mu_);
    calls_.push_back({op, std::move(mark_)});
    mark_ = nullptr;
    return OkStatus();
  }

  const std::function<int64_t()> stamp_;
  std::shared_ptr<const ComputeMark> mark_;  // the stream's thread's alone
  mutable Mutex mu_;
  std::vector<Call> calls_ GUARDED_BY(mu_);
};

const GptLayout& Layout() {
  static const GptLayout layout = GptLayout::Whole(GptConfig{8, 37, 40, 2, 2, 16});
  return layout;
}

// One step's backward of the last micro-batch: every unit's gradient made ready, last unit
// first, as GptStage's backward does.
void Backward(TrainingMemory* memory) {
  memory->BeginStep();
  memory->SetLastMicroBatch(true);
  const auto& units = Layout().units();
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    bool accumulate = false;
    ASSERT_TRUE(memory->AcquireGrads(u, &accumulate).ok());
    ASSERT_TRUE(memory->GradsReady(u).ok());
  }
  ASSERT_TRUE(memory->FinishGradients(nullptr).ok());
}

TEST(DataParallelMemoryTest, EveryBucketsReductionFollowsAMarkTakenWhenItWasHandedOver) {
  for (int zero_stage : {0, 1}) {
    MarkRecordingGroup dp;
    {
      // Buckets of about one layer, so that there are several.
      DataParallelMemory memory(&Layout(), CpuOps(), &dp, zero_stage, /*bucket_floats=*/2000, {});
      Backward(&memory);
    }
    const std::vector<MarkRecordingGroup::Call> calls = dp.calls();
    ASSERT_GE(calls.size(), 3u) << "zero " << zero_stage;
    for (const auto& call : calls) {
      EXPECT_STREQ(call.op, zero_stage == 0 ? "AllReduce" : "ReduceScatter");
      EXPECT_NE(call.mark, nullptr) << call.op << " at zero " << zero_stage << " followed no mark";
    }
  }
}

// ZeRO-2/3: every unit's gradient is reduce-scattered after a mark; under ZeRO-3 so is every
// gather of a unit's parameters (its shard copied first, on the training thread).
TEST(ShardedMemoryTest, EveryGradientReductionAndGatherFollowsAMark) {
  for (int zero_stage : {2, 3}) {
    MarkRecordingGroup dp;
    {
      ShardedMemory memory(&Layout(), CpuOps(), &dp, /*replica=*/nullptr, zero_stage);
      const int units = static_cast<int>(Layout().units().size());
      if (zero_stage == 3) {
        for (int u = 0; u < units; ++u) {
          ASSERT_TRUE(memory.AcquireParams(u).ok());
          ASSERT_TRUE(memory.ReleaseParams(u).ok());
        }
      }
      Backward(&memory);
    }
    const std::vector<MarkRecordingGroup::Call> calls = dp.calls();
    int gathers = 0, reductions = 0;
    for (const auto& call : calls) {
      gathers += std::string(call.op) == "AllGather";
      reductions += std::string(call.op) == "ReduceScatter";
      EXPECT_NE(call.mark, nullptr) << call.op << " at zero " << zero_stage << " followed no mark";
    }
    EXPECT_EQ(reductions, static_cast<int>(Layout().units().size())) << "zero " << zero_stage;
    if (zero_stage == 3) {
      EXPECT_GE(gathers, static_cast<int>(Layout().units().size()));
    }
  }
}

// A ZeRO-3 gather reads this rank's shard from the gather buffer, where the training thread
// copies it (a kernel, on a GPU): its mark must be taken after that copy was enqueued, or
// NCCL could read the buffer before the shard landed. The marks are stamped with the
// number of copies the table had made, which must include the unit's own.
TEST(ShardedMemoryTest, AGathersMarkIsTakenAfterTheRanksShardWasCopied) {
  ProfiledOps ops(CpuOps());
  MarkRecordingGroup dp([&] { return ops.totals(ProfiledOps::kCopy).calls; });
  std::vector<int64_t> copies_after;  // by unit: copies made once its gather was started
  {
    ShardedMemory memory(&Layout(), &ops, &dp, /*replica=*/nullptr, /*zero_stage=*/3);
    for (int u = 0; u < static_cast<int>(Layout().units().size()); ++u) {
      ASSERT_TRUE(memory.AcquireParams(u).ok());
      copies_after.push_back(ops.totals(ProfiledOps::kCopy).calls);
      ASSERT_TRUE(memory.ReleaseParams(u).ok());
    }
  }
  std::vector<int64_t> stamps;
  for (const auto& call : dp.calls()) {
    if (std::string(call.op) != "AllGather") continue;
    const auto* mark = dynamic_cast<const MarkRecordingGroup::StampedMark*>(call.mark.get());
    ASSERT_NE(mark, nullptr) << "a gather followed no mark";
    stamps.push_back(mark->stamp);
  }
  ASSERT_EQ(stamps.size(), copies_after.size());
  bool copied = false;  // some unit's gather had a shard of this rank to copy
  for (size_t u = 0; u < stamps.size(); ++u) {
    EXPECT_EQ(stamps[u], copies_after[u]) << "unit " << u << "'s gather was marked before its copy";
    copied = copied || (u == 0 ? copies_after[u] > 0 : copies_after[u] > copies_after[u - 1]);
  }
  EXPECT_TRUE(copied) << "no unit held a shard of this rank: the test shows nothing";
}

// A group of `size` in which this process is member `rank`; its all-reduces are recorded
// with how many calls `dp` had recorded by then.
class ReplicaGroup final : public testing::FakeGroup {
 public:
  struct Reduction {
    size_t count;
    ReduceOp op;
    size_t dp_calls_before;
  };
  ReplicaGroup(int rank, int size, const MarkRecordingGroup* dp = nullptr)
      : FakeGroup("dprep", size), rank_(rank), dp_(dp) {}
  int rank() const override { return rank_; }
  Status AllReduce(void*, size_t count, DataType, ReduceOp op) override {
    MutexLock lock(&mu_);
    reductions_.push_back({count, op, dp_ != nullptr ? dp_->calls().size() : 0});
    return OkStatus();
  }
  std::vector<Reduction> reductions() const {
    MutexLock lock(&mu_);
    return reductions_;
  }

 private:
  const int rank_;
  const MarkRecordingGroup* dp_;
  mutable Mutex mu_;
  std::vector<Reduction> reductions_ GUARDED_BY(mu_);
};

// A shard group of two, member `rank`.
class ShardGroup final : public testing::FakeGroup {
 public:
  explicit ShardGroup(int rank) : FakeGroup("dp", 2), rank_(rank) {}
  int rank() const override { return rank_; }

 private:
  const int rank_;
};

// Hybrid sharding: the replicas average their gradient shards once a step, unit by unit on
// the last micro-batch, each right after that unit's reduce-scatter (the tied unit on host
// memory after its rows), so that the averages overlap the rest of backward; together they
// cover the owned shard once.
TEST(ShardedMemoryTest, HybridShardingAveragesEachUnitsShardOverTheReplicasOnTheLastMicroBatch) {
  for (int zero_stage : {2, 3}) {
    MarkRecordingGroup dp;
    ReplicaGroup replica(1, 2, &dp);
    const GptLayout& layout = Layout();
    const int units = static_cast<int>(layout.units().size());
    const int e = layout.embedding_unit();
    ASSERT_EQ(e, layout.head_unit());
    ASSERT_TRUE(TiedUnitReadyAfterHeadOn(CpuOps())) << "the rows follow the tied unit on the CPU";
    const int B = 1, T = 2, C = layout.config().channels;
    const std::vector<int32_t> inputs = {1, 2};
    const std::vector<float> dout(static_cast<size_t>(B) * T * C, 0.5f);
    size_t owned = 0;
    {
      ShardedMemory memory(&layout, CpuOps(), &dp, &replica, zero_stage);
      owned = memory.owned_end() - memory.owned_begin();
      EXPECT_EQ(memory.owned_replica(), 1);
      memory.BeginStep();
      for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
        memory.SetLastMicroBatch(micro_batch == 1);
        // As GptStage's backward on one stage: the head's unit (the tied one) first, ready at
        // once, its embedding rows at the very end.
        std::vector<int> order = {e};
        for (int u = units - 1; u >= 0; --u) {
          if (u != e) order.push_back(u);
        }
        for (int unit : order) {
          bool accumulate = false;
          ASSERT_TRUE(memory.AcquireGrads(unit, &accumulate).ok());
          ASSERT_TRUE(memory.GradsReady(unit).ok());
        }
        ASSERT_TRUE(memory.AddEmbeddingGrads(e, inputs.data(), dout.data(), B, T).ok());
      }
      ASSERT_TRUE(memory.FinishGradients(nullptr).ok());
    }
    const std::vector<ReplicaGroup::Reduction> got = replica.reductions();
    ASSERT_GE(got.size(), 2u) << "zero " << zero_stage;
    size_t covered = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      covered += got[i].count;
      EXPECT_EQ(got[i].op, ReduceOp::kAverage);
      // Never before the last micro-batch's reductions began: the first micro-batch's units
      // and its rows' gather were all reduced before it.
      EXPECT_GT(got[i].dp_calls_before, static_cast<size_t>(units + 1)) << "zero " << zero_stage;
    }
    EXPECT_EQ(covered, owned) << "zero " << zero_stage;
    // The tied unit's average comes last, after the gather of its rows (the dp group's last
    // call).
    EXPECT_EQ(got.back().dp_calls_before, dp.calls().size()) << "zero " << zero_stage;
  }
}

// What a checkpoint writes and a restore reads: each replica an even part of its shard, so
// that the shares of every dp rank tile the local arena once.
TEST(ShardedMemoryTest, HybridShardingSharesTileTheArenaOnceAcrossReplicas) {
  const size_t n = Layout().num_params();
  std::vector<int> covered(n, 0);
  for (int s = 0; s < 2; ++s) {
    for (int r = 0; r < 3; ++r) {
      ShardGroup dp(s);
      ReplicaGroup replica(r, 3);
      ShardedMemory memory(&Layout(), CpuOps(), &dp, &replica, /*zero_stage=*/3);
      EXPECT_LE(memory.owned_begin(), memory.share_begin());
      EXPECT_LE(memory.share_end(), memory.owned_end());
      EXPECT_LT(memory.share_begin(), memory.share_end()) << "shard " << s << " replica " << r;
      for (size_t i = memory.share_begin(); i < memory.share_end(); ++i) ++covered[i];
    }
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(covered[i], 1) << "element " << i;
}

}  // namespace
}  // namespace drover::engine::parallel
