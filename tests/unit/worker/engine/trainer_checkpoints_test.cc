// The trainer's checkpoints as the job sees them: requests, drains and
// checkpoint.every_minutes agreed on by every rank, and
// checkpoints deferred (or given up) rather than waited for in the training thread while a
// previous one is late or waits on the coordinator.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/worker/engine/ckpt/checkpoint_test_util.h"
#include "tests/unit/worker/engine/trainer_test_util.h"
#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/parallel/kv_store.h"
#include "worker/engine/publish_fence.h"
#include "worker/engine/trainer.h"

namespace drover::engine {
namespace {

namespace fs = std::filesystem;

// A checkpoint request (SIGUSR1) reaches one rank only, at a moment of its own: its vote
// rides in the step's all-reduce and both ranks save the same step. One pending before the
// start is served at step 1; one made while step 5 is reported is served at step 6 (step
// 5's all-reduce is over by then). Nothing else is saved until the final checkpoint.
TEST_F(TrainerTest, ACheckpointRequestToOneRankIsSavedByEveryRankAtTheStepTheyAgreeOn) {
  struct Listener : TrainerListener {
    void OnStep(const StepMetrics& m) override {
      if (m.step == 5 && requests != nullptr) requests->fetch_add(1);
    }
    void OnCheckpoint(const v1::CheckpointRecord& record) override {
      steps.push_back(record.step());
    }
    void OnDone() override {}
    std::atomic<uint64_t>* requests = nullptr;
    std::vector<int64_t> steps;  // complete checkpoints (rank 0 reports them)
  };
  JobSpec spec = Spec({"checkpoint.every_steps=1000", "checkpoint.keep_last=10",
                       "train.eval_every=0", "train.micro_batch=2"});
  std::atomic<uint64_t> requests[2] = {0, 1};  // rank 1: one request before the start
  Listener listeners[2];
  listeners[1].requests = &requests[1];
  const std::vector<Status> results = RunTwoRanks(spec, [&](TrainerOptions& o) {
    o.listener = &listeners[o.rank];
    o.checkpoint_requests = &requests[o.rank];
  });
  for (int rank = 0; rank < 2; ++rank) ASSERT_TRUE(results[rank].ok()) << results[rank];
  EXPECT_THAT(listeners[0].steps, ::testing::ElementsAre(1, 6, 20));
  const fs::path ckpt = dir_ / "out" / "ckpt";
  for (int step : {1, 6, 20}) {
    EXPECT_TRUE(fs::exists(ckpt / ("step_" + std::to_string(step)) / "manifest.json")) << step;
  }
  EXPECT_FALSE(fs::exists(ckpt / "step_2"));
  EXPECT_FALSE(fs::exists(ckpt / "step_7"));
}

// checkpoint.every_minutes: rank 0's clock (a fake one, 25 s a step) decides, its vote rides
// in the step's all-reduce and both ranks save that step. The minutes count from the last
// checkpoint of either kind, so with checkpoint.every_steps 6 as well the time-due ones fall
// between those of the steps. The previous save is always waited for here (no deferral), so
// the steps do not depend on how fast this machine writes.
struct ClockListener : TrainerListener {
  void OnStep(const StepMetrics&) override {
    if (clock != nullptr) clock->AdvanceMs(25'000);
  }
  void OnCheckpoint(const v1::CheckpointRecord& record) override { steps.push_back(record.step()); }
  void OnDone() override {}
  FakeClock* clock = nullptr;
  std::vector<int64_t> steps;  // complete checkpoints (rank 0 reports them)
};

TEST_F(TrainerTest, ACheckpointIsSavedOnceEveryMinutesHavePassedSinceTheLast) {
  auto steps_at_25_s_a_step = [&](const JobSpec& spec) {
    FakeClock clock;
    ClockListener listeners[2];
    listeners[0].clock = &clock;
    const std::vector<Status> results = RunTwoRanks(spec, [&](TrainerOptions& o) {
      o.listener = &listeners[o.rank];
      o.clock = &clock;
      o.checkpoint_defer_after = std::chrono::minutes(10);
    });
    for (int rank = 0; rank < 2; ++rank) EXPECT_TRUE(results[rank].ok()) << results[rank];
    return listeners[0].steps;
  };
  const std::vector<std::string> common = {"checkpoint.every_minutes=1", "checkpoint.keep_last=20",
                                           "train.eval_every=0", "train.micro_batch=2"};
  std::vector<std::string> by_time = common;
  by_time.push_back("checkpoint.every_steps=0");
  // 75 s have passed when step 4 starts: it votes, and the minute counts again from there.
  EXPECT_THAT(steps_at_25_s_a_step(Spec(by_time)), ::testing::ElementsAre(4, 8, 12, 16, 20));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "ckpt" / "step_4" / "manifest.json"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "ckpt" / "step_5"));
  fs::remove_all(dir_ / "out");
  std::vector<std::string> both = common;
  both.push_back("checkpoint.every_steps=6");
  EXPECT_THAT(steps_at_25_s_a_step(Spec(both)), ::testing::ElementsAre(4, 6, 10, 12, 16, 18, 20));
}

// A drain (SIGUSR2: the node is shutting down) reaches rank 1 while step 5 is reported: the
// ranks agree on step 6 for its checkpoint, rank 1 stops once rank 0 has committed it, and
// rank 0 fails at the next collective, its peer gone, as on any node's loss. The next
// attempt resumes from step 6: the drain lost no training.
TEST_F(TrainerTest, ADrainedRankStopsOnceTheCheckpointOfTheAgreedStepIsCommitted) {
  struct Listener : TrainerListener {
    void OnStep(const StepMetrics& m) override {
      if (m.step != 5 || requests == nullptr) return;
      requests->fetch_add(1);  // as the signal thread does: the request, then the drain
      drain->store(true);
    }
    void OnCheckpoint(const v1::CheckpointRecord&) override {}
    void OnDone() override {}
    std::atomic<uint64_t>* requests = nullptr;
    std::atomic<bool>* drain = nullptr;
  };
  JobSpec spec = Spec({"checkpoint.every_steps=1000", "train.eval_every=0", "train.micro_batch=2",
                       "parallel.timeout_s=20"});
  std::atomic<uint64_t> requests[2] = {0, 0};
  std::atomic<bool> drain[2] = {false, false};
  Listener listeners[2];
  listeners[1].requests = &requests[1];
  listeners[1].drain = &drain[1];
  const std::vector<Status> results = RunTwoRanks(spec, [&](TrainerOptions& o) {
    o.listener = &listeners[o.rank];
    o.checkpoint_requests = &requests[o.rank];
    o.drain = &drain[o.rank];
  });
  EXPECT_EQ(results[1].code(), StatusCode::kCancelled) << results[1];
  EXPECT_THAT(results[1].message(),
              ::testing::HasSubstr("drained after checkpoint step 6 was committed"));
  EXPECT_FALSE(results[0].ok()) << "rank 0 trained on without its peer";
  const fs::path ckpt = dir_ / "out" / "ckpt";
  EXPECT_TRUE(fs::exists(ckpt / "step_6" / "manifest.json"));
  EXPECT_FALSE(fs::exists(ckpt / "step_7"));
  auto resumed = Make(spec);
  ASSERT_NE(resumed, nullptr);
  EXPECT_EQ(resumed->step(), 6);
}

// A drained job that saves no checkpoints stops after the step in progress.
TEST_F(TrainerTest, ADrainWithoutCheckpointsStopsAfterTheStep) {
  TrainerOptions options;
  options.spec = Spec({"train.eval_every=0"});
  options.log_steps = false;
  std::atomic<uint64_t> requests{1};
  std::atomic<bool> drain{true};
  options.checkpoint_requests = &requests;
  options.drain = &drain;
  auto trainer = Trainer::Create(options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  Status st = (*trainer)->Run();
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st;
  EXPECT_THAT(st.message(), ::testing::HasSubstr("drained after step 1 (the node is shutting "
                                                 "down; this job saves no checkpoints)"));
}

// A store that holds the first checkpoint report set through it (rank 1's shard of the
// job's first checkpoint) until released, or for 20 s: a report held up by a coordinator
// that is away.
class HoldingKvStore final : public parallel::KvStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    if (key.rfind("ckpt/", 0) == 0 && !held_.exchange(true)) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!released && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return base->Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base->Get(key, timeout);
  }
  parallel::KvStore* base = nullptr;  // the store every call goes to; set before the first
  std::atomic<bool> released{false};

 private:
  std::atomic<bool> held_{false};
};

// Rank 1's report of the first checkpoint's shard (step 2) is held up until rank 0 has
// trained through step 10: the checkpoints due at steps 4 to 10 find step 2's still in
// flight on both ranks (its commit waits for the report), and wait for the first step at
// which neither rank is still saving, while training goes on. Before, each rank's next save
// waited for its previous one in the training thread: rank 1 at step 4 for a report that
// waited for rank 0 to reach step 10, and rank 0 for rank 1 in the collectives, until their
// deadline failed the job.
TEST_F(TrainerTest, ACheckpointDueWhileARankIsStillSavingThePreviousOneIsDeferred) {
  struct Listener : TrainerListener {
    void OnStep(const StepMetrics& m) override {
      if (m.step == 10 && hold != nullptr) hold->released = true;
    }
    void OnCheckpoint(const v1::CheckpointRecord& record) override {
      steps.push_back(record.step());
    }
    void OnDone() override {}
    HoldingKvStore* hold = nullptr;
    std::vector<int64_t> steps;  // complete checkpoints (rank 0 reports them)
  };
  JobSpec spec = Spec({"checkpoint.every_steps=2", "checkpoint.keep_last=20", "train.eval_every=0",
                       "train.micro_batch=2", "parallel.timeout_s=5"});
  HoldingKvStore held;
  Listener listeners[2];
  listeners[0].hold = &held;
  const std::vector<Status> results = RunTwoRanks(spec, [&](TrainerOptions& o) {
    if (o.rank == 1) {
      held.base = o.store;
      o.store = &held;
    }
    o.listener = &listeners[o.rank];
    // Deferred as soon as it is in flight at all, so that when the checkpoint of step 4
    // falls due is no matter of timing.
    o.checkpoint_defer_after = std::chrono::milliseconds(0);
  });
  for (int rank = 0; rank < 2; ++rank) ASSERT_TRUE(results[rank].ok()) << results[rank];
  const std::vector<int64_t>& saved = listeners[0].steps;
  ASSERT_GE(saved.size(), 3u) << ::testing::PrintToString(saved);
  EXPECT_EQ(saved[0], 2);
  // The deferred one: after the release, at the first step both writers were idle again.
  EXPECT_GT(saved[1], 10) << ::testing::PrintToString(saved);
  EXPECT_EQ(saved.back(), 20);
  for (int64_t step : {4, 6, 8, 10}) {
    EXPECT_FALSE(fs::exists(dir_ / "out" / "ckpt" / ("step_" + std::to_string(step)))) << step;
  }
  auto deferred = ckpt::VerifyCheckpoint(
      (dir_ / "out" / "ckpt" / ("step_" + std::to_string(saved[1]))).string(), saved[1]);
  EXPECT_TRUE(deferred.ok()) << deferred.status();
}

// The coordinator goes away as step 2 ends, so the checkpoint of step 2 waits for its
// confirmation, and comes back as step 10 ends. Training goes on meanwhile: the checkpoints
// due at steps 4 to 8 are deferred (the write in flight waits on the coordinator, however
// young it is) or given up, never waited for in the training thread, and step 2's commits
// once the coordinator is back. Before, the checkpoint of step 4 waited in the training
// thread for step 2's (in flight for less than checkpoint_defer_after) for the whole outage,
// and with two ranks their peers' collectives failed the attempt meanwhile.
TEST_F(TrainerTest, ACheckpointDueWhileTheCoordinatorIsAwayIsNotWaitedForInTheTrainingThread) {
  ckpt::AwayFence fence;
  struct Listener : TrainerListener {
    void OnStep(const StepMetrics& m) override {
      seen = m.step;
      if (m.step == 2) fence->away = true;
      if (m.step == 10) fence->away = false;
    }
    void OnCheckpoint(const v1::CheckpointRecord& record) override {
      completed.push_back({record.step(), seen.load()});
    }
    void OnDone() override {}
    ckpt::AwayFence* fence = nullptr;
    std::atomic<int64_t> seen{0};
    std::vector<std::pair<int64_t, int64_t>> completed;  // (checkpoint step, step seen then)
  } listener;
  listener.fence = &fence;
  TrainerOptions options;
  options.spec =
      Spec({"checkpoint.every_steps=2", "checkpoint.keep_last=20", "train.eval_every=0"});
  options.fence = &fence;
  options.listener = &listener;
  options.log_steps = false;
  // Only the coordinator's absence defers: a write in flight for an hour would still be
  // waited for.
  options.checkpoint_defer_after = std::chrono::hours(1);
  auto trainer = Trainer::Create(options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Run().ok());
  ASSERT_FALSE(listener.completed.empty());
  EXPECT_EQ(listener.completed.front().first, 2);
  EXPECT_GE(listener.completed.front().second, 10) << "step 2's checkpoint committed before "
                                                      "the coordinator came back";
  EXPECT_EQ(listener.completed.back().first, 20);
  for (int step : {4, 6, 8}) {
    EXPECT_FALSE(fs::exists(dir_ / "out" / "ckpt" / ("step_" + std::to_string(step)))) << step;
  }
}

}  // namespace
}  // namespace drover::engine
