// worker/engine/parallel/data_parallel.h and zero_sharded.h: where the dp reductions and
// gathers they hand to their CommStream take their compute marks (communicator.h,
// MarkCompute). On NCCL a call without one waits for everything enqueued when the stream's
// thread makes it, on a GPU most of backward; so every such call must follow a mark, taken
// on the training thread when the call was handed over.
#include "worker/engine/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/mutex.h"
#include "tests/unit/worker/engine/parallel/fake_group.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/parallel/zero_sharded.h"

namespace drover::engine::parallel {
namespace {

// A dp group of two whose collectives leave the data as it is and record the mark each
// followed (FollowMark's, or null), and which thread took it; its marks are fresh objects.
class MarkRecordingGroup final : public testing::FakeGroup {
 public:
  struct Call {
    const char* op;
    std::shared_ptr<const ComputeMark> mark;
  };

  MarkRecordingGroup() : FakeGroup("dp", 2) {}

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
    return std::make_shared<ComputeMark>();
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
      ShardedMemory memory(&Layout(), CpuOps(), &dp, zero_stage);
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

}  // namespace
}  // namespace drover::engine::parallel
