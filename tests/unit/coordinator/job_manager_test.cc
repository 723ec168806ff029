#include "coordinator/job_manager.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/exit_codes.h"
#include "tests/unit/coordinator/test_util.h"

namespace drover::coordinator {
namespace {

using testing::Exited;
using testing::SpecYaml;
using testing::Trainer;

NodeCapacity Node(const std::string& name, int free) {
  NodeCapacity n{name, v1::CPU, {}};
  for (int i = 0; i < free; ++i) n.free_slots.push_back(i);
  return n;
}

class JobManagerTest : public ::testing::Test {
 protected:
  JobManagerTest()
      : jobs_(&clock_,
              {.stop_grace_ms = 5000, .coordinator_address = "127.0.0.1:1", .restart_backoff = {}},
              {[this](StoreBatch b) { batches_.push_back(std::move(b)); },
               [this](const std::string& j, int64_t a) { started_.emplace_back(j, a); },
               [this](const std::string& j, int64_t a) { ended_.emplace_back(j, a); }, nullptr,
               [this](const std::string& node, int slot, const std::string& why) {
                 failed_slots_.push_back({node, slot, why});
               },
               [this](const std::string& node, int slot, const std::string& why) {
                 straggling_slots_.push_back({node, slot, why});
               }}) {}

  // Submits a job the way the coordinator does once its record is durable.
  StatusOr<std::string> Submit(const std::string& yaml, const std::string& id, int64_t seq) {
    ASSIGN_OR_RETURN(JobManager::NewJob job, jobs_.PrepareSubmit(yaml, 0, id, seq));
    jobs_.Add(std::move(job));
    return id;
  }
  // Cancels a job the way the coordinator does (a plan, made once durable).
  StatusOr<v1::JobState> Cancel(const std::string& id) {
    const v1::JobRecord* rec = jobs_.Find(id);
    if (!rec) return NotFoundError(id);
    if (rec->state() == v1::CANCELLED) return rec->state();
    EXPECT_TRUE(jobs_.ApplyCancel(jobs_.PlanCancel(id)));
    return jobs_.Find(id)->state();
  }
  // Submits a job and places its first attempt on the given nodes.
  std::string SubmitAndPlace(int world, std::vector<NodeCapacity> nodes, int max_restarts = 2) {
    auto id = Submit(SpecYaml(world, world, max_restarts), "j1", 1);
    EXPECT_TRUE(id.ok()) << id.status();
    Place(*id, world, nodes);
    return *id;
  }
  void Place(const std::string& id, int world, const std::vector<NodeCapacity>& nodes,
             const v1::CheckpointRecord* resume = nullptr) {
    jobs_.StartAttempt({id, world, PackRanks(world, nodes)}, resume);
  }
  std::vector<v1::Order> OrdersFor(const std::string& node,
                                   const std::vector<v1::TrainerStatus>& listed) {
    JobManager::Orders orders;
    jobs_.AppendOrders(node, listed, &orders);
    return {orders.begin(), orders.end()};
  }
  // Feeds a heartbeat listing to the manager the way the coordinator does.
  void Listing(const std::string& node, const std::vector<v1::TrainerStatus>& listed) {
    for (const auto& t : listed) jobs_.OnTrainerStatus(node, t);
    jobs_.OnListing(node, listed);
  }
  v1::JobState State(const std::string& id) { return jobs_.Find(id)->state(); }

  FakeClock clock_;
  std::vector<StoreBatch> batches_;
  std::vector<std::pair<std::string, int64_t>> started_, ended_;
  struct FailedSlot {
    std::string node;
    int slot;
    std::string why;
  };
  std::vector<FailedSlot> failed_slots_;
  std::vector<FailedSlot> straggling_slots_;
  JobManager jobs_;
};

TEST_F(JobManagerTest, InvalidSpecIsRejectedWithTheParserMessage) {
  auto id = jobs_.PrepareSubmit("name: x\nmodel: {n_layer: -1}\n", 0, "j1", 1);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("n_layer"), std::string::npos);
}

TEST_F(JobManagerTest, StartOrdersResentUntilAgentListsTheTrainer) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 2)});
  EXPECT_EQ(State(id), v1::RUNNING);
  EXPECT_EQ(started_, (std::vector<std::pair<std::string, int64_t>>{{id, 1}}));
  auto orders = OrdersFor("n1", {});
  ASSERT_EQ(orders.size(), 2u);
  EXPECT_EQ(orders[0].start().rank(), 0);
  EXPECT_EQ(orders[1].start().world_size(), 2);
  EXPECT_EQ(orders[0].start().coordinator_address(), "127.0.0.1:1");
  EXPECT_TRUE(OrdersFor("n2", {}).empty());
  // Still re-sent while unacknowledged; only rank 1 once rank 0 is listed.
  EXPECT_EQ(OrdersFor("n1", {}).size(), 2u);
  Listing("n1", {Trainer(id, 1, 0)});
  orders = OrdersFor("n1", {Trainer(id, 1, 0)});
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].start().rank(), 1);
}

TEST_F(JobManagerTest, SucceedsWhenEveryRankExitedZero) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 2)});
  Listing("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 0));
  EXPECT_EQ(State(id), v1::RUNNING);
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 1, 0));
  EXPECT_EQ(State(id), v1::SUCCEEDED);
  EXPECT_EQ(jobs_.Attempts(id).back().end_reason(), "succeeded");
  EXPECT_EQ(batches_.back().jobs.back().state(), v1::SUCCEEDED);
}

TEST_F(JobManagerTest, TrainerExitStopsSurvivorsAndNextAttemptResumes) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 1), Node("n2", 1)});
  Listing("n1", {Trainer(id, 1, 0)});
  Listing("n2", {Trainer(id, 1, 1)});
  jobs_.OnTrainerStatus("n2", Exited(id, 1, 1, 0, 9));
  EXPECT_EQ(State(id), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find(id)->restarts(), 1);
  EXPECT_NE(jobs_.Find(id)->reason().find("rank 1 on n2 was killed by signal 9"),
            std::string::npos);
  EXPECT_EQ(ended_.size(), 1u);
  // The survivor on n1 is ordered to stop, with the grace period, until it is gone.
  auto orders = OrdersFor("n1", {Trainer(id, 1, 0)});
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].stop().attempt(), 1);
  EXPECT_EQ(orders[0].stop().grace_ms(), 5000);
  EXPECT_TRUE(OrdersFor("n1", {Trainer(id, 1, 0, v1::TRAINER_EXITED)}).empty());
  // The next attempt resumes from the checkpoint it is given.
  v1::CheckpointRecord ckpt;
  ckpt.set_job_id(id);
  ckpt.set_step(40);
  ckpt.set_path("/ckpt/step_40");
  Place(id, 2, {Node("n1", 2)}, &ckpt);
  EXPECT_EQ(jobs_.Find(id)->attempt(), 2);
  orders = OrdersFor("n1", {});
  ASSERT_EQ(orders.size(), 2u);
  EXPECT_EQ(orders[0].start().attempt(), 2);
  EXPECT_EQ(orders[0].start().resume_checkpoint(), "/ckpt/step_40");
  EXPECT_EQ(jobs_.Attempts(id).back().resume_step(), 40);
}

// After a recovery the job's step follows the new attempt from its checkpoint, so the CLI
// can show the recomputed steps; furthest_step keeps how far the job had got.
TEST_F(JobManagerTest, ResumedAttemptRestartsLastStepAtItsCheckpointAndKeepsFurthestStep) {
  const std::string id = SubmitAndPlace(1, {Node("n1", 1), Node("n2", 1)});
  Listing("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 55)});
  EXPECT_EQ(jobs_.Find(id)->last_step(), 55);
  EXPECT_EQ(jobs_.Find(id)->furthest_step(), 55);
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 0, 9));
  ASSERT_EQ(State(id), v1::RECOVERING);
  v1::CheckpointRecord ckpt;
  ckpt.set_job_id(id);
  ckpt.set_step(40);
  ckpt.set_path("/ckpt/step_40");
  Place(id, 1, {Node("n2", 1)}, &ckpt);
  EXPECT_EQ(jobs_.Find(id)->last_step(), 40);
  EXPECT_EQ(jobs_.Find(id)->furthest_step(), 55);
  EXPECT_EQ(batches_.back().jobs.back().last_step(), 40);  // persisted with the attempt
  Listing("n2", {Trainer(id, 2, 0, v1::TRAINER_RUNNING, 43)});
  EXPECT_EQ(jobs_.Find(id)->last_step(), 43);
  EXPECT_EQ(jobs_.Find(id)->furthest_step(), 55);
  // A late report of the old attempt is fenced and moves nothing.
  Listing("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 56)});
  EXPECT_EQ(jobs_.Find(id)->last_step(), 43);
  Listing("n2", {Trainer(id, 2, 0, v1::TRAINER_RUNNING, 60)});
  EXPECT_EQ(jobs_.Find(id)->last_step(), 60);
  EXPECT_EQ(jobs_.Find(id)->furthest_step(), 60);
}

TEST_F(JobManagerTest, OldAttemptReportsAreFenced) {
  const std::string id = SubmitAndPlace(1, {Node("n1", 1)});
  Listing("n1", {Trainer(id, 1, 0)});
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 1));
  Place(id, 1, {Node("n1", 1)});
  Listing("n1", {Trainer(id, 2, 0)});
  // A late exit 0 of attempt 1 must not finish attempt 2, nor a crash fail it.
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 0));
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 1));
  EXPECT_EQ(State(id), v1::RUNNING);
  EXPECT_EQ(jobs_.Find(id)->attempt(), 2);
  EXPECT_FALSE(jobs_.IsCurrent({id, 1, 0}));
  EXPECT_TRUE(jobs_.IsCurrent({id, 2, 0}));
  v1::CheckpointRecord old;
  old.set_job_id(id);
  old.set_attempt(1);
  old.set_step(10);
  EXPECT_FALSE(jobs_.OnCheckpoint(old));
  // A report from a node the rank was not placed on is ignored too.
  jobs_.OnTrainerStatus("n9", Exited(id, 2, 0, 1));
  EXPECT_EQ(State(id), v1::RUNNING);
}

TEST_F(JobManagerTest, MaxRestartsHonouredThenFailedWithReason) {
  const std::string id = SubmitAndPlace(1, {Node("n1", 1)}, /*max_restarts=*/1);
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 1));
  EXPECT_EQ(State(id), v1::RECOVERING);
  Place(id, 1, {Node("n1", 1)});
  jobs_.OnTrainerStatus("n1", Exited(id, 2, 0, 1));
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_EQ(jobs_.Find(id)->restarts(), 1);
  EXPECT_NE(jobs_.Find(id)->reason().find("max_restarts (1) used up"), std::string::npos);
  EXPECT_TRUE(jobs_.Pending().empty());
}

TEST_F(JobManagerTest, TrainerThatRejectsItsInputFailsTheJobAtOnceWithItsMessage) {
  // Exit code 2 is input the user must fix: another attempt would fail the same way.
  const std::string id = SubmitAndPlace(2, {Node("n1", 1), Node("n2", 1)}, /*max_restarts=*/5);
  v1::TrainerStatus exited = Exited(id, 1, 1, 2);
  exited.set_last_error(
      "E drover-trainer: trainer start-up: NOT_FOUND: data.train: no token shard "
      "matches '/data/x_*.bin'");
  jobs_.OnTrainerStatus("n2", exited);
  EXPECT_EQ(State(id), v1::FAILED);
  EXPECT_EQ(jobs_.Find(id)->restarts(), 0);
  const std::string reason = jobs_.Find(id)->reason();
  EXPECT_NE(reason.find("rank 1 on n2 exited with code 2: E drover-trainer: trainer start-up: "
                        "NOT_FOUND: data.train: no token shard matches '/data/x_*.bin'"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("not restarted"), std::string::npos) << reason;
  EXPECT_TRUE(jobs_.Pending().empty());
  // Another failure keeps its restart, and its message too.
  auto submitted = Submit(SpecYaml(1, 1, 2), "j2", 2);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string other = *submitted;
  Place(other, 1, {Node("n3", 1)});
  v1::TrainerStatus crashed = Exited(other, 1, 0, 1);
  crashed.set_last_error("E drover-trainer: training: UNAVAILABLE: peer closed the connection");
  jobs_.OnTrainerStatus("n3", crashed);
  EXPECT_EQ(State(other), v1::RECOVERING);
  EXPECT_NE(jobs_.Find(other)->reason().find("peer closed the connection"), std::string::npos);
}

TEST_F(JobManagerTest, ADrainedTrainerRestartsTheJobElsewhereNotCounted) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 1), Node("n2", 1)}, /*max_restarts=*/0);
  Listing("n1", {Trainer(id, 1, 0)});
  Listing("n2", {Trainer(id, 1, 1)});
  v1::TrainerStatus drained = Exited(id, 1, 1, kExitDrained);
  drained.set_last_error(
      "W drover-trainer: drained after checkpoint step 40 was committed (the node is shutting "
      "down)");
  jobs_.OnTrainerStatus("n2", drained);
  EXPECT_EQ(State(id), v1::RECOVERING) << "max_restarts 0, yet not failed";
  EXPECT_EQ(jobs_.Find(id)->restarts(), 0);
  const std::string reason = jobs_.Find(id)->reason();
  EXPECT_NE(
      reason.find("drained: a node is taken out of service (rank 1 on n2 exited with code 75: "),
      std::string::npos)
      << reason;
  EXPECT_NE(reason.find("drained after checkpoint step 40"), std::string::npos) << reason;
  EXPECT_NE(reason.find("not counted against max_restarts"), std::string::npos) << reason;
  EXPECT_TRUE(failed_slots_.empty()) << "no GPU is at fault";
}

TEST_F(JobManagerTest, ATrainerWhoseGpuFailedHasItsSlotCordonedAndTheRestartIsNotCounted) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 2)}, /*max_restarts=*/1);
  Listing("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  v1::TrainerStatus failed = Exited(id, 1, 1, kExitDeviceFault);
  failed.set_last_error(
      "lt_matmul.cu:208: the GPU failed: cudaStreamSynchronize(stream_): "
      "cudaErrorECCUncorrectable (uncorrectable ECC error encountered)");
  jobs_.OnTrainerStatus("n1", failed);
  EXPECT_EQ(State(id), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find(id)->restarts(), 0);
  const std::string reason = jobs_.Find(id)->reason();
  EXPECT_NE(reason.find("the GPU of n1 slot 1 failed (rank 1 on n1 exited with code 3: "
                        "lt_matmul.cu:208: the GPU failed"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("not counted against max_restarts"), std::string::npos) << reason;
  ASSERT_EQ(failed_slots_.size(), 1u);
  EXPECT_EQ(failed_slots_[0].node, "n1");
  EXPECT_EQ(failed_slots_[0].slot, 1);
  EXPECT_NE(failed_slots_[0].why.find("job j1 attempt 1: rank 1 on n1 exited with code 3"),
            std::string::npos)
      << failed_slots_[0].why;
  // Listed again by the next heartbeats: handed over once.
  Listing("n1", {Trainer(id, 1, 0), failed});
  EXPECT_EQ(failed_slots_.size(), 1u);
  // The survivor's own failure, after the attempt ended, is no GPU fault...
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 1));
  EXPECT_EQ(failed_slots_.size(), 1u);
  // ...but an ended attempt's trainer whose GPU failed has its slot cordoned all the same:
  // its peer, which lost the collective, may have reported first.
  Place(id, 2, {Node("n2", 2)});
  jobs_.OnTrainerStatus("n2", Exited(id, 2, 0, 1));
  EXPECT_EQ(jobs_.Find(id)->restarts(), 1);
  jobs_.OnTrainerStatus("n2", Exited(id, 2, 1, kExitDeviceFault));
  ASSERT_EQ(failed_slots_.size(), 2u);
  EXPECT_EQ(failed_slots_[1].node, "n2");
  EXPECT_EQ(failed_slots_[1].slot, 1);
  // A trainer killed by a signal is not a GPU fault, whatever its number.
  Place(id, 1, {Node("n1", 1)});
  jobs_.OnTrainerStatus("n1", Exited(id, 3, 0, 0, kExitDeviceFault));
  EXPECT_EQ(State(id), v1::FAILED);  // max_restarts (1) used up
  EXPECT_EQ(failed_slots_.size(), 2u);
}

// A slot its agent's health check found unfit, under a running rank: the attempt fails at
// once, the restart not counted; the rank's own exit with kExitDeviceFault that may follow
// does not cordon the slot a second time; a slot no rank holds fails nothing.
TEST_F(JobManagerTest, ASlotFoundUnfitUnderARankFailsItsAttemptUncounted) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 2)}, /*max_restarts=*/1);
  Listing("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  jobs_.OnSlotFailed("n1", 5, "no rank here");
  EXPECT_EQ(State(id), v1::RUNNING);
  jobs_.OnSlotFailed("n1", 1, "its GPU failed the node's health check: GPU 0000:19:00.0: ECC");
  EXPECT_EQ(State(id), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find(id)->restarts(), 0);
  const std::string reason = jobs_.Find(id)->reason();
  EXPECT_NE(reason.find("attempt 1 failed: rank 1 on n1 slot 1: its GPU failed the node's "
                        "health check: GPU 0000:19:00.0: ECC"),
            std::string::npos)
      << reason;
  EXPECT_NE(reason.find("not counted against max_restarts"), std::string::npos) << reason;
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 1, kExitDeviceFault));
  EXPECT_TRUE(failed_slots_.empty());
}

TEST_F(JobManagerTest, NodeLossHangAndVanishedRankFailTheAttempt) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 1), Node("n2", 1)}, 5);
  jobs_.OnNodeLost("n2", "is dead");
  EXPECT_EQ(State(id), v1::RECOVERING);
  EXPECT_NE(jobs_.Find(id)->reason().find("node n2 is dead"), std::string::npos);

  Place(id, 1, {Node("n1", 1)});
  Listing("n1", {Trainer(id, 2, 0, v1::TRAINER_RUNNING, 7)});
  jobs_.OnHang({id, 2, 0});
  EXPECT_NE(jobs_.Find(id)->reason().find("rank 0 hung: step 7"), std::string::npos);

  Place(id, 1, {Node("n1", 1)});
  Listing("n1", {Trainer(id, 3, 0)});
  Listing("n1", {});  // listed before, gone now without an exit report
  EXPECT_NE(jobs_.Find(id)->reason().find("rank 0 vanished"), std::string::npos);
  EXPECT_EQ(jobs_.Find(id)->restarts(), 3);
}

TEST_F(JobManagerTest, RankZerosCheckpointFailureAndRollbacksAreShown) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 2)});
  v1::TrainerStatus r0 = Trainer(id, 1, 0), r1 = Trainer(id, 1, 1);
  r0.mutable_progress()->set_checkpoint_error("UNAVAILABLE: No space left on device");
  r0.mutable_progress()->set_rollbacks(2);
  r1.mutable_progress()->set_checkpoint_error("ignored: only rank 0 writes");
  Listing("n1", {r0, r1});
  EXPECT_EQ(jobs_.Find(id)->checkpoint_error(), "UNAVAILABLE: No space left on device");
  EXPECT_EQ(jobs_.Find(id)->rollbacks(), 2);
  r0.mutable_progress()->clear_checkpoint_error();
  Listing("n1", {r0, r1});
  EXPECT_EQ(jobs_.Find(id)->checkpoint_error(), "");
}

TEST_F(JobManagerTest, CancelStopsEverythingAndIsIdempotent) {
  const std::string id = SubmitAndPlace(1, {Node("n1", 1)});
  Listing("n1", {Trainer(id, 1, 0)});
  EXPECT_EQ(*Cancel(id), v1::CANCELLED);
  EXPECT_EQ(*Cancel(id), v1::CANCELLED);
  EXPECT_EQ(Cancel("nope").status().code(), StatusCode::kNotFound);
  auto orders = OrdersFor("n1", {Trainer(id, 1, 0)});
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].stop().reason(), "cancelled");
}

TEST_F(JobManagerTest, SubmitAndCancelChangeNothingUntilTheCallerMakesThem) {
  // The coordinator writes a submit or a cancel before making it: until then, nothing.
  auto job = jobs_.PrepareSubmit(SpecYaml(1, 1), 0, "j1", 1);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->record.state(), v1::PENDING);
  EXPECT_EQ(jobs_.Find("j1"), nullptr);
  EXPECT_TRUE(batches_.empty());
  jobs_.Add(std::move(*job));
  Place("j1", 1, {Node("n1", 1)});
  Listing("n1", {Trainer("j1", 1, 0)});
  const size_t written = batches_.size();
  JobManager::CancelPlan plan = jobs_.PlanCancel("j1");
  EXPECT_EQ(State("j1"), v1::RUNNING);
  EXPECT_EQ(batches_.size(), written);
  ASSERT_EQ(plan.batch.jobs.size(), 1u);
  EXPECT_EQ(plan.batch.jobs[0].state(), v1::CANCELLED);
  ASSERT_EQ(plan.batch.attempts.size(), 1u);
  EXPECT_EQ(plan.batch.attempts[0].end_reason(), "cancelled");
  EXPECT_TRUE(ended_.empty());
  EXPECT_TRUE(OrdersFor("n1", {Trainer("j1", 1, 0)}).empty());

  // Made: memory now holds exactly the records the plan wrote.
  ASSERT_TRUE(jobs_.ApplyCancel(plan));
  EXPECT_EQ(State("j1"), v1::CANCELLED);
  EXPECT_EQ(jobs_.Find("j1")->finished_ms(), plan.batch.jobs[0].finished_ms());
  EXPECT_EQ(jobs_.Attempts("j1").back().SerializeAsString(),
            plan.batch.attempts[0].SerializeAsString());
  EXPECT_EQ(ended_.size(), 1u);
  EXPECT_EQ(batches_.size(), written);  // persisted by the caller, not again
}

TEST_F(JobManagerTest, CancelPlanIsStaleOnceTheJobMovedOn) {
  // The plan's record was written; then the trainer exited and the job's newer record was
  // queued after it. Applying the old plan would leave memory CANCELLED and disk
  // RECOVERING, so the plan is refused and worked out again.
  const std::string id = SubmitAndPlace(1, {Node("n1", 1)});
  Listing("n1", {Trainer(id, 1, 0)});
  JobManager::CancelPlan stale = jobs_.PlanCancel(id);
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 1));
  ASSERT_EQ(State(id), v1::RECOVERING);
  EXPECT_FALSE(jobs_.ApplyCancel(stale));
  EXPECT_EQ(State(id), v1::RECOVERING);
  JobManager::CancelPlan fresh = jobs_.PlanCancel(id);
  EXPECT_TRUE(fresh.batch.attempts.empty());  // no attempt runs: none to end
  ASSERT_TRUE(jobs_.ApplyCancel(fresh));
  EXPECT_EQ(State(id), v1::CANCELLED);
  EXPECT_FALSE(jobs_.ApplyCancel(fresh));  // once only
}

TEST_F(JobManagerTest, EachNodeSeesOnlyItsOwnRanks) {
  const std::string id = SubmitAndPlace(3, {Node("n1", 2), Node("n2", 1)});
  auto sorted = [](std::vector<int> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(jobs_.ReservedSlots("n1")), (std::vector<int>{0, 1}));
  EXPECT_EQ(jobs_.ReservedSlots("n2"), std::vector<int>{0});
  EXPECT_TRUE(jobs_.ReservedSlots("n3").empty());
  auto orders = OrdersFor("n2", {});
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].start().rank(), 2);
  EXPECT_EQ(orders[0].start().world_size(), 3);
  // n2 lists its rank; n1 lists only one of its two: nothing is lost until n1 had listed
  // a rank and then dropped it.
  Listing("n2", {Trainer(id, 1, 2)});
  Listing("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  EXPECT_EQ(State(id), v1::RUNNING);
  Listing("n1", {Trainer(id, 1, 0)});
  EXPECT_EQ(State(id), v1::RECOVERING);
  EXPECT_TRUE(jobs_.ReservedSlots("n1").empty());
  EXPECT_TRUE(jobs_.ReservedSlots("n2").empty());
}

TEST_F(JobManagerTest, UnknownLiveTrainersAreOrderedStopped) {
  auto orders = OrdersFor("n1", {Trainer("ghost", 4, 0), Trainer("ghost", 4, 1)});
  ASSERT_EQ(orders.size(), 1u);  // one order per (job, attempt)
  EXPECT_EQ(orders[0].stop().job_id(), "ghost");
  EXPECT_EQ(orders[0].stop().reason(), "unknown job");
}

TEST_F(JobManagerTest, RestoreResendsStartsForRunningAttempt) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 2)});
  Listing("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  std::vector<v1::JobRecord> records = {*jobs_.Find(id)};
  std::vector<v1::AttemptRecord> attempts = jobs_.Attempts(id);
  JobManager restored(&clock_, {}, {});
  restored.Restore(records, attempts);
  EXPECT_EQ(restored.Find(id)->state(), v1::RUNNING);
  JobManager::Orders orders;
  restored.AppendOrders("n1", {}, &orders);
  EXPECT_EQ(orders.size(), 2);  // idempotent on the agent, which already runs them
  EXPECT_TRUE(restored.IsCurrent({id, 1, 1}));
}

// A pending job carries the ranks the scheduler keeps together (a hybrid shard group of tp
// groups here: tp 2 x dp_shard 2), and only the world sizes whose dp the shard group divides.
TEST_F(JobManagerTest, APendingJobCarriesItsRankBlockAndTheSizesItsShardGroupsAllow) {
  ASSERT_TRUE(
      Submit(SpecYaml(2, 8) + "parallel: {tp: 2, zero_stage: 3, dp_shard: 2}\n", "j1", 1).ok());
  const std::vector<PendingJob> pending = jobs_.Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].rank_block, 4);
  EXPECT_EQ(pending[0].feasible_world_sizes, (std::vector<int>{4, 8}));
}

TEST_F(JobManagerTest, AJobPlacedSmallerToKeepItsBlocksWholeSaysSoAndOffersThemToGrowth) {
  auto id = Submit(SpecYaml(2, 8) + "parallel: {tp: 2}\n", "j1", 1);
  ASSERT_TRUE(id.ok()) << id.status();
  ScheduleResult r = Schedule(jobs_.Pending(), {Node("n1", 3), Node("n2", 3)}, {{v1::CPU, 6}});
  ASSERT_EQ(r.placements.size(), 1u);
  jobs_.StartAttempt(r.placements[0], nullptr);
  EXPECT_EQ(State(*id), v1::RUNNING);
  EXPECT_EQ(jobs_.Find(*id)->placement_size(), 4);
  EXPECT_EQ(jobs_.Find(*id)->reason(),
            "placed at 4 ranks, not the 6 that fit: at 6, a block of 2 ranks (parallel.tp x "
            "dp_shard) would span nodes");
  const std::vector<RunningJob> running = jobs_.Resizable();
  ASSERT_EQ(running.size(), 1u);
  EXPECT_EQ(running[0].rank_block, 2);
  ASSERT_EQ(running[0].ranks.size(), 4u);
  EXPECT_EQ(running[0].ranks[3].node(), jobs_.Find(*id)->placement(3).node());
}

TEST_F(JobManagerTest, ASlotDrainWithNoFreeSlotShrinksTheJobAndTakesItOutOfResizePlans) {
  auto id = Submit(SpecYaml(1, 2), "j1", 1);
  ASSERT_TRUE(id.ok()) << id.status();
  Place(*id, 2, {Node("n1", 2)});
  ASSERT_EQ(jobs_.Resizable().size(), 1u);
  const int slot = jobs_.Find(*id)->placement(1).slot();
  bool checkpoints = false;
  EXPECT_EQ(jobs_.PlanSlotDrain(
                "n1", slot, "drained by ops@h", [](v1::DeviceKind) { return false; }, &checkpoints),
            *id);
  EXPECT_TRUE(checkpoints);
  EXPECT_EQ(jobs_.Find(*id)->reason(),
            "moving rank 1 off n1 slot " + std::to_string(slot) +
                " (drained by ops@h) at its next checkpoint, shrinking from 2 to 1 ranks: no free "
                "slot to move it to");
  // Its attempt ends at that checkpoint: no growth or preemption plan meanwhile.
  EXPECT_TRUE(jobs_.Resizable().empty());
  // A slot no current rank runs on moves nothing.
  EXPECT_EQ(jobs_.PlanSlotDrain(
                "n1", 7, "x", [](v1::DeviceKind) { return true; }, &checkpoints),
            "");
  EXPECT_EQ(jobs_.PlanSlotDrain(
                "n2", 0, "x", [](v1::DeviceKind) { return true; }, &checkpoints),
            "");
}

TEST_F(JobManagerTest, RestartsBackOffWhileAttemptsKeepFailingAndSayHowLong) {
  const std::string id = SubmitAndPlace(1, {Node("n1", 1)}, /*max_restarts=*/20);
  // The first failure is restarted at once: one node failure costs nothing extra.
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 1));
  EXPECT_EQ(State(id), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find(id)->failures_in_a_row(), 1);
  EXPECT_EQ(jobs_.Find(id)->restart_not_before_ms(), 0);
  const std::vector<PendingJob> pending = jobs_.Pending();
  ASSERT_EQ(pending.size(), 1u);
  // Regrouping, for the default stop grace (5 s) and a second: a scheduling pass is due
  // then, when a survivor that never exits stops holding it back.
  EXPECT_TRUE(pending[0].regrouping);
  EXPECT_EQ(jobs_.NextRestartMs(), clock_.WallNowMs() + 6000);

  // Then 1 s, doubling up to 30 s, for each attempt that fails again.
  const std::vector<int64_t> delays = {1000, 2000, 4000, 8000, 16000, 30000, 30000};
  for (size_t i = 0; i < delays.size(); ++i) {
    const int64_t attempt = static_cast<int64_t>(i) + 2;
    const int failures = static_cast<int>(i) + 2;
    Place(id, 1, {Node("n1", 1)});
    clock_.AdvanceMs(100);  // it fails quickly
    jobs_.OnTrainerStatus("n1", Exited(id, attempt, 0, 1));
    const v1::JobRecord& rec = *jobs_.Find(id);
    ASSERT_EQ(rec.state(), v1::RECOVERING);
    EXPECT_EQ(rec.failures_in_a_row(), failures);
    EXPECT_EQ(rec.restart_not_before_ms(), clock_.WallNowMs() + delays[i]);
    EXPECT_EQ(batches_.back().jobs.back().restart_not_before_ms(), rec.restart_not_before_ms());
    EXPECT_NE(rec.reason().find("restarting in " + std::to_string(delays[i] / 1000) + " s after " +
                                std::to_string(failures) + " failures in a row"),
              std::string::npos)
        << rec.reason();
    EXPECT_TRUE(jobs_.Pending().empty()) << "attempt " << attempt;
    EXPECT_EQ(jobs_.NextRestartMs(), rec.restart_not_before_ms());
    clock_.AdvanceMs(delays[i] - 1);
    EXPECT_TRUE(jobs_.Pending().empty());
    EXPECT_NE(jobs_.Find(id)->reason().find("restarting in 1 s"), std::string::npos);
    clock_.AdvanceMs(1);
    EXPECT_EQ(jobs_.Pending().size(), 1u);
  }

  // An attempt that ran for reset_after_ms before it failed starts the count again.
  Place(id, 1, {Node("n1", 1)});
  EXPECT_EQ(jobs_.Find(id)->restart_not_before_ms(), 0);
  clock_.AdvanceMs(RestartBackoff{}.reset_after_ms);
  jobs_.OnTrainerStatus("n1", Exited(id, 9, 0, 1));
  EXPECT_EQ(jobs_.Find(id)->failures_in_a_row(), 1);
  EXPECT_EQ(jobs_.Pending().size(), 1u);
}

TEST_F(JobManagerTest, NextPlacementAvoidsTheNodesItsFailingAttemptsFailedOn) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 1), Node("n2", 1)}, 10);
  jobs_.OnTrainerStatus("n2", Exited(id, 1, 1, 1));
  ASSERT_EQ(jobs_.Pending().size(), 1u);
  EXPECT_EQ(jobs_.Pending()[0].avoid_nodes, std::set<std::string>{"n2"});
  Place(id, 2, {Node("n3", 2)});
  jobs_.OnNodeLost("n3", "is dead");
  clock_.AdvanceMs(1000);
  ASSERT_EQ(jobs_.Pending().size(), 1u);
  EXPECT_EQ(jobs_.Pending()[0].avoid_nodes, (std::set<std::string>{"n2", "n3"}));
  // A failure after a long run is a new story: only its own node is avoided.
  Place(id, 2, {Node("n1", 2)});
  Listing("n1", {Trainer(id, 3, 0, v1::TRAINER_RUNNING, 5), Trainer(id, 3, 1)});
  clock_.AdvanceMs(RestartBackoff{}.reset_after_ms);
  jobs_.OnHang({id, 3, 0});
  ASSERT_EQ(jobs_.Pending().size(), 1u);
  EXPECT_EQ(jobs_.Pending()[0].avoid_nodes, std::set<std::string>{"n1"});
}

TEST_F(JobManagerTest, RestoredJobKeepsItsRestartDelay) {
  const std::string id = SubmitAndPlace(1, {Node("n1", 1)}, 10);
  jobs_.OnTrainerStatus("n1", Exited(id, 1, 0, 1));
  Place(id, 1, {Node("n1", 1)});
  jobs_.OnTrainerStatus("n1", Exited(id, 2, 0, 1));
  const int64_t not_before = jobs_.Find(id)->restart_not_before_ms();
  ASSERT_GT(not_before, clock_.WallNowMs());
  // What the store holds: the last record written of the job.
  JobManager restored(&clock_, {}, {});
  restored.Restore({batches_.back().jobs.back()}, jobs_.Attempts(id));
  EXPECT_EQ(restored.NextRestartMs(), not_before);
  EXPECT_TRUE(restored.Pending().empty());
  const std::string reason = restored.Find(id)->reason();
  EXPECT_NE(reason.find("restarting in 1 s after 2 failures in a row"), std::string::npos)
      << reason;
  EXPECT_EQ(reason.find("restarting in"), reason.rfind("restarting in")) << reason;
  clock_.AdvanceMs(not_before - clock_.WallNowMs());
  EXPECT_EQ(restored.Pending().size(), 1u);
}

v1::CheckpointRecord Checkpoint(const std::string& job, int64_t attempt, int64_t step) {
  v1::CheckpointRecord c;
  c.set_job_id(job);
  c.set_attempt(attempt);
  c.set_step(step);
  c.set_path("/ckpt/step_" + std::to_string(step));
  return c;
}

TEST_F(JobManagerTest, GrowsAtItsNextCheckpointWithoutCountingARestart) {
  ASSERT_TRUE(Submit(SpecYaml(2, 4, 2), "j1", 1).ok());
  Place("j1", 2, {Node("n1", 1), Node("n2", 1)});
  Listing("n1", {Trainer("j1", 1, 0)});
  Listing("n2", {Trainer("j1", 1, 1)});
  auto growable = jobs_.Resizable();
  ASSERT_EQ(growable.size(), 1u);
  EXPECT_EQ(growable[0].world_size, 2);
  EXPECT_EQ(growable[0].feasible_world_sizes.back(), 4);
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 2));  // no plan yet: nothing happens
  EXPECT_EQ(State("j1"), v1::RUNNING);
  jobs_.PlanResize("j1", ResizePlan{4, {}});
  EXPECT_EQ(jobs_.Find("j1")->reason(), "growing to 4 ranks at its next checkpoint");
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 2));  // not a new checkpoint
  EXPECT_EQ(State("j1"), v1::RUNNING);
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 4));
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find("j1")->restarts(), 0);
  EXPECT_EQ(jobs_.Find("j1")->failures_in_a_row(), 0);
  EXPECT_EQ(jobs_.Find("j1")->latest_checkpoint_step(), 4);
  EXPECT_EQ(jobs_.Attempts("j1").back().end_reason(),
            "resized: growing from 2 to 4 ranks at the checkpoint of step 4");
  EXPECT_EQ(batches_.back().jobs.back().state(), v1::RECOVERING);
  // Its old ranks are told to stop.
  ASSERT_EQ(OrdersFor("n1", {Trainer("j1", 1, 0)}).size(), 1u);
  // Until its old ranks' slots are back (the grace period and a second), it is placed only
  // at the planned size; then at whatever fits, as after a failure.
  auto pending = jobs_.Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].feasible_world_sizes, std::vector<int>{4});
  EXPECT_EQ(jobs_.NextRestartMs(), clock_.WallNowMs() + 5000 + 1000);
  clock_.AdvanceMs(6000);
  EXPECT_EQ(jobs_.Pending()[0].feasible_world_sizes, (std::vector<int>{2, 3, 4}));
  v1::CheckpointRecord resume = Checkpoint("j1", 1, 4);
  Place("j1", 4, {Node("n1", 1), Node("n2", 1), Node("n3", 1), Node("n4", 1)}, &resume);
  EXPECT_EQ(jobs_.Attempts("j1").back().world_size(), 4);
  EXPECT_EQ(jobs_.Attempts("j1").back().resume_step(), 4);
  EXPECT_EQ(jobs_.Resizable()[0].world_size, 4);
  EXPECT_EQ(jobs_.Find("j1")->reason(), "");
}

TEST_F(JobManagerTest, AWithdrawnPlanOrAFinalCheckpointDoesNotResize) {
  ASSERT_TRUE(Submit(SpecYaml(1, 2, 2), "j1", 1).ok());
  Place("j1", 1, {Node("n1", 1)});
  jobs_.PlanResize("j1", ResizePlan{2, {}});
  jobs_.PlanResize("j1", std::nullopt);  // the slots were taken meanwhile
  EXPECT_EQ(jobs_.Find("j1")->reason(), "");
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 4));
  EXPECT_EQ(State("j1"), v1::RUNNING);
  jobs_.PlanResize("j1", ResizePlan{2, {}});
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 10));  // train.steps: the job is about to end
  EXPECT_EQ(State("j1"), v1::RUNNING);
}

TEST_F(JobManagerTest, JobsWithoutCheckpointsNeitherGrowNorArePreempted) {
  ASSERT_TRUE(Submit(SpecYaml(1, 2, 2) + "checkpoint: {every_steps: 0}\n", "j1", 1).ok());
  Place("j1", 1, {Node("n1", 1)});
  ASSERT_TRUE(Submit(SpecYaml(1, 2, 2), "j2", 2).ok());
  Place("j2", 2, {Node("n2", 2)});
  auto resizable = jobs_.Resizable();
  ASSERT_EQ(resizable.size(), 1u);
  EXPECT_EQ(resizable[0].job_id, "j2");
  // A plan for its own size is no plan.
  jobs_.PlanResize("j2", ResizePlan{2, {}});
  EXPECT_EQ(jobs_.Find("j2")->reason(), "");
}

TEST_F(JobManagerTest, ShrinksForAHigherPriorityJobAtItsNextCheckpoint) {
  ASSERT_TRUE(Submit(SpecYaml(1, 4, 2), "j1", 1).ok());
  Place("j1", 4, {Node("n1", 4)});
  jobs_.PlanResize("j1", ResizePlan{2, {"j2", 5, 2}});
  EXPECT_EQ(jobs_.Find("j1")->reason(),
            "shrinking to 2 ranks for job j2 (priority 5) at its next checkpoint");
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 4));
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find("j1")->restarts(), 0);
  EXPECT_EQ(jobs_.Attempts("j1").back().end_reason(),
            "resized: shrinking from 4 to 2 ranks at the checkpoint of step 4 for job j2 "
            "(priority 5)");
  // Held at the smaller size or larger while its old ranks stop, as after growing.
  EXPECT_EQ(jobs_.Pending()[0].feasible_world_sizes, (std::vector<int>{2, 3, 4}));
}

TEST_F(JobManagerTest, YieldsEverySlotForAHigherPriorityJobWithoutCountingARestart) {
  ASSERT_TRUE(Submit(SpecYaml(2, 2, 0), "j1", 1).ok());  // no restarts allowed at all
  Place("j1", 2, {Node("n1", 2)});
  jobs_.PlanResize("j1", ResizePlan{0, {"j2", 5, 2}});
  EXPECT_EQ(jobs_.Find("j1")->reason(),
            "yielding its slots for job j2 (priority 5) at its next checkpoint");
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 6));
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find("j1")->restarts(), 0);
  EXPECT_EQ(jobs_.Find("j1")->failures_in_a_row(), 0);
  EXPECT_EQ(jobs_.Find("j1")->reason(),
            "preempted by job j2 (priority 5) at the checkpoint of step 6");
  EXPECT_EQ(jobs_.Attempts("j1").back().end_reason(), jobs_.Find("j1")->reason());
  auto pending = jobs_.Pending();
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].feasible_world_sizes, std::vector<int>{2});
  EXPECT_EQ(jobs_.NextRestartMs(), INT64_MAX);  // no delay: it waits only for slots
  v1::CheckpointRecord resume = Checkpoint("j1", 1, 6);
  Place("j1", 2, {Node("n1", 2)}, &resume);
  EXPECT_EQ(State("j1"), v1::RUNNING);
  EXPECT_EQ(jobs_.Attempts("j1").back().resume_step(), 6);
}

TEST_F(JobManagerTest, AFailureWhileAGrowIsPlannedIsAnOrdinaryRestart) {
  ASSERT_TRUE(Submit(SpecYaml(1, 2, 2), "j1", 1).ok());
  Place("j1", 1, {Node("n1", 1)});
  jobs_.PlanResize("j1", ResizePlan{2, {}});
  jobs_.OnNodeLost("n1", "is dead");
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find("j1")->restarts(), 1);
  EXPECT_EQ(jobs_.Pending()[0].feasible_world_sizes, (std::vector<int>{1, 2}));
  EXPECT_EQ(jobs_.Find("j1")->reason().find("growing"), std::string::npos);
}

std::vector<v1::CheckpointTrainersOrder> CheckpointOrders(const std::vector<v1::Order>& orders) {
  std::vector<v1::CheckpointTrainersOrder> out;
  for (const v1::Order& o : orders) {
    if (o.has_checkpoint()) out.push_back(o.checkpoint());
  }
  return out;
}

TEST_F(JobManagerTest, ACheckpointRequestIsOrderedUntilACheckpointAfterItCompletes) {
  const std::string id = SubmitAndPlace(2, {Node("n1", 2)});
  const std::vector<v1::TrainerStatus> listed = {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 7),
                                                 Trainer(id, 1, 1, v1::TRAINER_RUNNING, 6)};
  Listing("n1", listed);
  EXPECT_TRUE(CheckpointOrders(OrdersFor("n1", listed)).empty());
  auto after = jobs_.RequestCheckpoint(id, "requested by a user");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, 7);  // the newest step a rank reported
  auto orders = CheckpointOrders(OrdersFor("n1", listed));
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].job_id(), id);
  EXPECT_EQ(orders[0].attempt(), 1);
  EXPECT_EQ(orders[0].reason(), "requested by a user");
  const int64_t request_id = orders[0].request_id();
  EXPECT_GT(request_id, 0);
  EXPECT_TRUE(CheckpointOrders(OrdersFor("n2", {})).empty());
  // Asked again while pending: the same request, so no trainer is signalled twice.
  EXPECT_EQ(*jobs_.RequestCheckpoint(id, "again"), 7);
  EXPECT_EQ(CheckpointOrders(OrdersFor("n1", listed))[0].request_id(), request_id);
  // The checkpoint of step 7 may have been in flight before the request: not the one asked for.
  jobs_.OnCheckpoint(Checkpoint(id, 1, 7));
  EXPECT_EQ(CheckpointOrders(OrdersFor("n1", listed)).size(), 1u);
  jobs_.OnCheckpoint(Checkpoint(id, 1, 8));
  EXPECT_TRUE(CheckpointOrders(OrdersFor("n1", listed)).empty());
  // A new request is a new id (in the same millisecond too), after the newest checkpoint.
  EXPECT_EQ(*jobs_.RequestCheckpoint(id, "later"), 8);
  orders = CheckpointOrders(OrdersFor("n1", listed));
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_GT(orders[0].request_id(), request_id);
  // It ends with its attempt: the next one is not asked.
  jobs_.OnNodeLost("n1", "is dead");
  EXPECT_TRUE(CheckpointOrders(OrdersFor("n1", {})).empty());
}

TEST_F(JobManagerTest, ACheckpointRequestIsRefusedForAJobThatIsNotRunningOrSavesNone) {
  EXPECT_EQ(jobs_.RequestCheckpoint("nope", "x").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(Submit(SpecYaml(1, 1), "j1", 1).ok());
  auto pending = jobs_.RequestCheckpoint("j1", "x");
  EXPECT_EQ(pending.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pending.status().message(),
            "job j1 is PENDING: only a running job can save a checkpoint");
  ASSERT_TRUE(Submit(SpecYaml(1, 1) + "checkpoint: {every_steps: 0}\n", "j2", 2).ok());
  Place("j2", 1, {Node("n1", 1)});
  auto none = jobs_.RequestCheckpoint("j2", "x");
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.status().message(),
            "job j2 saves no checkpoints (its checkpoint.every_steps and every_minutes are 0)");
  // Checkpoints by time alone are checkpoints.
  ASSERT_TRUE(
      Submit(SpecYaml(1, 1) + "checkpoint: {every_steps: 0, every_minutes: 30}\n", "j3", 3).ok());
  Place("j3", 1, {Node("n2", 1)});
  EXPECT_TRUE(jobs_.RequestCheckpoint("j3", "x").ok());
}

// A resize waits for a checkpoint, so its plan asks for one at once; the plan withdrawn,
// the request goes too, unless a user had asked for one as well.
TEST_F(JobManagerTest, APlannedResizeAsksForACheckpointThatGoesWithThePlan) {
  ASSERT_TRUE(Submit(SpecYaml(1, 4, 2), "j1", 1).ok());
  Place("j1", 4, {Node("n1", 4)});
  EXPECT_TRUE(jobs_.PlanResize("j1", ResizePlan{2, {"j2", 5, 2}}));
  auto orders = CheckpointOrders(OrdersFor("n1", {}));
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].reason(),
            "shrinking to 2 ranks for job j2 (priority 5) at its next checkpoint");
  // Every scheduling pass plans again: no new request.
  EXPECT_FALSE(jobs_.PlanResize("j1", ResizePlan{2, {"j2", 5, 2}}));
  EXPECT_FALSE(jobs_.PlanResize("j1", ResizePlan{1, {"j2", 5, 3}}));
  EXPECT_EQ(CheckpointOrders(OrdersFor("n1", {}))[0].request_id(), orders[0].request_id());
  EXPECT_FALSE(jobs_.PlanResize("j1", std::nullopt));
  EXPECT_TRUE(CheckpointOrders(OrdersFor("n1", {})).empty());

  EXPECT_TRUE(jobs_.PlanResize("j1", ResizePlan{2, {"j2", 5, 2}}));
  ASSERT_TRUE(jobs_.RequestCheckpoint("j1", "requested by a user").ok());
  EXPECT_FALSE(jobs_.PlanResize("j1", std::nullopt));
  EXPECT_EQ(CheckpointOrders(OrdersFor("n1", {})).size(), 1u);
  // The checkpoint comes; a plan made meanwhile is carried out at it.
  EXPECT_FALSE(jobs_.PlanResize("j1", ResizePlan{2, {"j2", 5, 2}}));
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 3));
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_TRUE(CheckpointOrders(OrdersFor("n1", {})).empty());
}

TEST_F(JobManagerTest, ARankStragglingLongEnoughIsReplacedAtACheckpointWithoutCountingARestart) {
  std::string yaml = SpecYaml(3, 3, 2);
  yaml.replace(yaml.rfind('}'), 1, ", replace_stragglers_after_s: 10}");
  ASSERT_TRUE(Submit(yaml, "j1", 1).ok());
  Place("j1", 3, {Node("n1", 1), Node("n2", 1), Node("n3", 1)});
  const auto paced = [](int rank, double busy_ms) {
    v1::TrainerStatus t = Trainer("j1", 1, rank, v1::TRAINER_RUNNING, 4);
    t.mutable_progress()->set_busy_ms(busy_ms);
    return t;
  };
  Listing("n1", {paced(0, 80)});
  Listing("n2", {paced(1, 150)});
  Listing("n3", {paced(2, 82)});
  bool spare = true;
  int spare_asked = 0;
  const auto check = [&] {
    return jobs_.CheckStragglers(clock_.WallNowMs(), [&](v1::DeviceKind device) {
      EXPECT_EQ(device, v1::CPU);
      ++spare_asked;
      return spare;
    });
  };
  EXPECT_TRUE(check().empty());  // straggling from now on
  clock_.AdvanceMs(9000);
  EXPECT_TRUE(check().empty());
  // Back in step for a moment: its count starts again.
  Listing("n2", {paced(1, 85)});
  EXPECT_TRUE(check().empty());
  Listing("n2", {paced(1, 150)});
  EXPECT_TRUE(check().empty());
  clock_.AdvanceMs(9000);
  EXPECT_TRUE(check().empty());
  EXPECT_EQ(spare_asked, 0);
  // 11 s in a row, but no free slot to move it to: it stays.
  clock_.AdvanceMs(2000);
  spare = false;
  EXPECT_TRUE(check().empty());
  EXPECT_EQ(spare_asked, 1);
  EXPECT_EQ(jobs_.Find("j1")->reason(), "");
  spare = true;
  EXPECT_EQ(check(), std::vector<std::string>{"j1"});
  const std::string who =
      "straggler rank 1 on n2 slot 0 (busy 150 ms a step against 81 ms for the others of its "
      "stage, for 11 s)";
  EXPECT_EQ(jobs_.Find("j1")->reason(), "replacing " + who + " at its next checkpoint");
  const auto orders = CheckpointOrders(OrdersFor("n2", {paced(1, 150)}));
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].reason(), "replacing " + who + " at its next checkpoint");
  EXPECT_TRUE(check().empty());  // planned once
  EXPECT_EQ(State("j1"), v1::RUNNING);

  jobs_.OnCheckpoint(Checkpoint("j1", 1, 5));
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find("j1")->restarts(), 0);
  EXPECT_EQ(jobs_.Find("j1")->failures_in_a_row(), 0);
  EXPECT_EQ(jobs_.Attempts("j1").back().end_reason(),
            "replacing " + who + " at the checkpoint of step 5");
  ASSERT_EQ(straggling_slots_.size(), 1u);
  EXPECT_EQ(straggling_slots_[0].node, "n2");
  EXPECT_EQ(straggling_slots_[0].slot, 0);
  EXPECT_EQ(straggling_slots_[0].why, "job j1: " + who);
  EXPECT_TRUE(failed_slots_.empty());
  // As after a resize: placed at its size while its old ranks' slots come back, and away
  // from the straggler's node where it fits.
  ASSERT_EQ(jobs_.Pending().size(), 1u);
  EXPECT_EQ(jobs_.Pending()[0].feasible_world_sizes, std::vector<int>{3});
  EXPECT_EQ(jobs_.Pending()[0].avoid_nodes, std::set<std::string>{"n2"});
}

// Without a free slot, an elastic job drops its stragglers at a checkpoint when the pace it
// had without them, scaled to its smaller size, beats its pace now: every straggler at once,
// once each has straggled long enough. Grown back onto a slot still slow, it drops it again
// by the pace it had at the smaller size.
TEST_F(JobManagerTest, WithoutAFreeSlotAnElasticJobDropsItsStragglersWhenThatPays) {
  std::string yaml = SpecYaml(2, 4, 2);
  yaml.replace(yaml.rfind('}'), 1, ", replace_stragglers_after_s: 10}");
  ASSERT_TRUE(Submit(yaml, "j1", 1).ok());
  Place("j1", 4, {Node("n1", 1), Node("n2", 1), Node("n3", 1), Node("n4", 1)});
  // Every rank steps at the job's pace; a straggler's busy time is most of it.
  const auto paced = [](int rank, double busy_ms, double pace_ms) {
    v1::TrainerStatus t = Trainer("j1", 1, rank, v1::TRAINER_RUNNING, 4);
    t.mutable_progress()->set_busy_ms(busy_ms);
    t.mutable_progress()->set_pace_ms(pace_ms);
    return t;
  };
  const auto check = [&] {
    return jobs_.CheckStragglers(clock_.WallNowMs(), [](v1::DeviceKind) { return false; });
  };
  const std::string nodes[] = {"n1", "n2", "n3", "n4"};
  for (int r = 0; r < 4; ++r) Listing(nodes[r], {paced(r, 80, 85)});
  EXPECT_TRUE(check().empty());  // its pace without stragglers: 85 ms
  Listing("n1", {paced(0, 80, 305)});
  Listing("n2", {paced(1, 300, 305)});
  Listing("n3", {paced(2, 80, 305)});
  Listing("n4", {paced(3, 80, 305)});
  EXPECT_TRUE(check().empty());
  clock_.AdvanceMs(5000);
  Listing("n4", {paced(3, 300, 305)});  // a second straggler, 5 s later
  EXPECT_TRUE(check().empty());
  clock_.AdvanceMs(5000);
  // Rank 1 has straggled for 10 s, rank 3 for 5: dropping rank 1 alone would leave the job
  // at rank 3's pace, so nothing yet.
  EXPECT_TRUE(check().empty());
  EXPECT_EQ(jobs_.Find("j1")->reason(), "");
  clock_.AdvanceMs(5000);
  EXPECT_EQ(check(), std::vector<std::string>{"j1"});
  const std::string who =
      "stragglers rank 1 on n2 slot 0 (busy 300 ms a step against 80 ms for the others of its "
      "stage, for 15 s) and rank 3 on n4 slot 0 (busy 300 ms a step against 80 ms for the "
      "others of its stage, for 10 s)";
  // 4 ranks to 2: its 85 ms a step doubles.
  const std::string how =
      ", shrinking from 4 to 2 ranks: no free slot to move them to, and a step without them "
      "should take about 170 ms (85 ms at 4 ranks without stragglers, times 4/2) against 305 ms "
      "now";
  EXPECT_EQ(jobs_.Find("j1")->reason(), "dropping " + who + " at its next checkpoint" + how);
  EXPECT_TRUE(check().empty());  // planned once

  jobs_.OnCheckpoint(Checkpoint("j1", 1, 5));
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_EQ(jobs_.Find("j1")->restarts(), 0);
  EXPECT_EQ(jobs_.Attempts("j1").back().end_reason(),
            "dropping " + who + " at the checkpoint of step 5" + how);
  ASSERT_EQ(straggling_slots_.size(), 2u);
  EXPECT_EQ(straggling_slots_[0].node, "n2");
  EXPECT_EQ(straggling_slots_[0].why,
            "job j1: straggler rank 1 on n2 slot 0 (busy 300 ms a step against 80 ms for the "
            "others of its stage, for 15 s)");
  EXPECT_EQ(straggling_slots_[1].node, "n4");
  EXPECT_EQ(straggling_slots_[1].slot, 0);
  // Placed at the smaller size or larger while the ranks' slots come back.
  ASSERT_EQ(jobs_.Pending().size(), 1u);
  EXPECT_EQ(jobs_.Pending()[0].feasible_world_sizes, (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(jobs_.Pending()[0].avoid_nodes, (std::set<std::string>{"n2", "n4"}));

  // At 2 ranks, then grown back to 4 once the cordons end (the scheduler's plan), with rank
  // 1's slot still slow from the attempt's start: the pace it had at 4 ranks without
  // stragglers, in the first attempt, is what it is dropped by again.
  Place("j1", 2, {Node("n1", 1), Node("n3", 1)});
  const auto attempt = [](int64_t a, int rank, double busy_ms, double pace_ms) {
    v1::TrainerStatus t = Trainer("j1", a, rank, v1::TRAINER_RUNNING, 8);
    t.mutable_progress()->set_busy_ms(busy_ms);
    t.mutable_progress()->set_pace_ms(pace_ms);
    return t;
  };
  Listing("n1", {attempt(2, 0, 150, 160)});
  Listing("n3", {attempt(2, 1, 150, 160)});
  EXPECT_TRUE(check().empty());
  jobs_.PlanResize("j1", ResizePlan{4, {}});
  jobs_.OnCheckpoint(Checkpoint("j1", 2, 8));
  ASSERT_EQ(State("j1"), v1::RECOVERING);
  Place("j1", 4, {Node("n1", 1), Node("n2", 1), Node("n3", 1), Node("n4", 1)});
  for (int r = 0; r < 4; ++r) Listing(nodes[r], {attempt(3, r, r == 1 ? 300 : 80, 305)});
  EXPECT_TRUE(check().empty());
  clock_.AdvanceMs(10'000);
  EXPECT_EQ(check(), std::vector<std::string>{"j1"});
  EXPECT_EQ(jobs_.Find("j1")->reason(),
            "dropping straggler rank 1 on n2 slot 0 (busy 300 ms a step against 80 ms for the "
            "others of its stage, for 10 s) at its next checkpoint, shrinking from 4 to 3 ranks: "
            "no free slot to move it to, and a step without it should take about 113 ms (85 ms "
            "at 4 ranks without stragglers, times 4/3) against 305 ms now");
}

// The pace a job had without stragglers is in its record, as of the record's last write (a
// checkpoint's): a coordinator restarted from its store drops a straggler that appears after
// the restart by it, where one that knew nothing of the job's past would keep it.
TEST_F(JobManagerTest, ACoordinatorRestartedFromItsStoreDropsByThePacesItHadWritten) {
  std::string yaml = SpecYaml(1, 2, 2);
  yaml.replace(yaml.rfind('}'), 1, ", replace_stragglers_after_s: 10}");
  ASSERT_TRUE(Submit(yaml, "j1", 1).ok());
  Place("j1", 2, {Node("n1", 1), Node("n2", 1)});
  const auto paced = [](int rank, double busy_ms, double pace_ms) {
    v1::TrainerStatus t = Trainer("j1", 1, rank, v1::TRAINER_RUNNING, 4);
    t.mutable_progress()->set_busy_ms(busy_ms);
    t.mutable_progress()->set_pace_ms(pace_ms);
    return t;
  };
  const auto none = [](v1::DeviceKind) { return false; };
  Listing("n1", {paced(0, 70, 75)});
  Listing("n2", {paced(1, 70, 75)});
  EXPECT_TRUE(jobs_.CheckStragglers(clock_.WallNowMs(), none).empty());
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 4));  // writes the record
  ASSERT_FALSE(batches_.empty());
  const v1::JobRecord written = batches_.back().jobs.back();
  EXPECT_EQ(written.healthy_pace_ms().at(2), 75);

  JobManager restored(&clock_, {}, {});
  restored.Restore({written}, jobs_.Attempts("j1"));
  for (const auto& [node, status] :
       {std::pair{"n1", paced(0, 70, 305)}, std::pair{"n2", paced(1, 300, 305)}}) {
    restored.OnTrainerStatus(node, status);
    restored.OnListing(node, {status});
  }
  EXPECT_TRUE(restored.CheckStragglers(clock_.WallNowMs(), none).empty());
  clock_.AdvanceMs(10'000);
  EXPECT_EQ(restored.CheckStragglers(clock_.WallNowMs(), none), std::vector<std::string>{"j1"});
  EXPECT_EQ(restored.Find("j1")->reason(),
            "dropping straggler rank 1 on n2 slot 0 (busy 300 ms a step against 70 ms for the "
            "others of its stage, for 10 s) at its next checkpoint, shrinking from 2 to 1 ranks: "
            "no free slot to move it to, and a step without it should take about 150 ms (75 ms "
            "at 2 ranks without stragglers, times 2/1) against 305 ms now");
}

// A straggler is kept where dropping it would slow its job down (a little slow), where the
// job cannot shrink, and where the job never ran without it: its pace then is unknown.
TEST_F(JobManagerTest, AStragglerIsKeptWhereDroppingItWouldNotPayOrCannotBeTold) {
  struct Case {
    std::string id;
    int min;
    double healthy_pace, busy;  // healthy_pace 0: slow from the start
  };
  int seq = 0;
  for (const Case& c :
       {Case{"little", 1, 80, 150}, Case{"rigid", 2, 80, 300}, Case{"from-the-start", 1, 0, 300}}) {
    SCOPED_TRACE(c.id);
    std::string yaml = SpecYaml(c.min, 2, 2);
    yaml.replace(yaml.rfind('}'), 1, ", replace_stragglers_after_s: 1}");
    ASSERT_TRUE(Submit(yaml, c.id, ++seq).ok());
    std::string a = c.id, b = c.id;  // not c.id + "-a": GCC 12 warns (-Wrestrict) falsely
    a += "-a";
    b += "-b";
    Place(c.id, 2, {Node(a, 1), Node(b, 1)});
    const auto paced = [&](int rank, double busy_ms, double pace_ms) {
      v1::TrainerStatus t = Trainer(c.id, 1, rank, v1::TRAINER_RUNNING, 20);
      t.mutable_progress()->set_busy_ms(busy_ms);
      t.mutable_progress()->set_pace_ms(pace_ms);
      return t;
    };
    const auto none = [](v1::DeviceKind) { return false; };
    if (c.healthy_pace > 0) {
      Listing(a, {paced(0, 78, c.healthy_pace)});
      Listing(b, {paced(1, 79, c.healthy_pace)});
      EXPECT_TRUE(jobs_.CheckStragglers(clock_.WallNowMs(), none).empty());
    }
    Listing(a, {paced(0, 78, c.busy + 2)});
    Listing(b, {paced(1, c.busy, c.busy + 2)});
    EXPECT_TRUE(jobs_.CheckStragglers(clock_.WallNowMs(), none).empty());
    clock_.AdvanceMs(3'600'000);
    // "little": alone, rank 0 would take 160 ms a step against 152 now.
    EXPECT_TRUE(jobs_.CheckStragglers(clock_.WallNowMs(), none).empty());
    EXPECT_EQ(State(c.id), v1::RUNNING);
    EXPECT_EQ(jobs_.Find(c.id)->reason(), "");
  }
}

TEST_F(JobManagerTest, StragglersOfAJobThatDoesNotReplaceThemAreLeftWhereTheyAre) {
  ASSERT_TRUE(Submit(SpecYaml(2, 2, 2), "j1", 1).ok());
  Place("j1", 2, {Node("n1", 1), Node("n2", 1)});
  v1::TrainerStatus slow = Trainer("j1", 1, 1, v1::TRAINER_RUNNING, 20);
  slow.mutable_progress()->set_busy_ms(500);
  v1::TrainerStatus fast = Trainer("j1", 1, 0, v1::TRAINER_RUNNING, 20);
  fast.mutable_progress()->set_busy_ms(50);
  Listing("n1", {fast});
  Listing("n2", {slow});
  const auto spare = [](v1::DeviceKind) { return true; };
  EXPECT_TRUE(jobs_.CheckStragglers(clock_.WallNowMs(), spare).empty());
  clock_.AdvanceMs(3'600'000);
  EXPECT_TRUE(jobs_.CheckStragglers(clock_.WallNowMs(), spare).empty());
  EXPECT_EQ(State("j1"), v1::RUNNING);
}

// SpecYaml's job with resources.time_limit_minutes set (and `extra` spec lines).
std::string TimeLimitedSpec(int world, double minutes, const std::string& extra = "") {
  std::string yaml = SpecYaml(world, world, 2);
  const std::string key = "world_size:";
  yaml.insert(yaml.find(key), "time_limit_minutes: " + std::to_string(minutes) + ", ");
  return yaml + extra;
}

std::vector<v1::StopTrainersOrder> StopOrders(const std::vector<v1::Order>& orders) {
  std::vector<v1::StopTrainersOrder> out;
  for (const v1::Order& o : orders) {
    if (o.has_stop()) out.push_back(o.stop());
  }
  return out;
}

TEST_F(JobManagerTest, AJobThatRanItsTimeLimitOverItsAttemptsStopsAtACheckpointAskedThenAndFails) {
  ASSERT_TRUE(Submit(TimeLimitedSpec(2, 1), "j1", 1).ok());
  Place("j1", 2, {Node("n1", 2)});
  // 40 s in the first attempt, which fails; the 10 s it waits are not counted.
  clock_.AdvanceMs(40'000);
  jobs_.OnTrainerStatus("n1", Exited("j1", 1, 0, 1));
  ASSERT_EQ(State("j1"), v1::RECOVERING);
  clock_.AdvanceMs(10'000);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  EXPECT_EQ(State("j1"), v1::RECOVERING);
  Place("j1", 2, {Node("n1", 2)});
  const std::vector<v1::TrainerStatus> listed = {Trainer("j1", 2, 0, v1::TRAINER_RUNNING, 7),
                                                 Trainer("j1", 2, 1, v1::TRAINER_RUNNING, 7)};
  Listing("n1", listed);
  clock_.AdvanceMs(19'999);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  EXPECT_TRUE(CheckpointOrders(OrdersFor("n1", listed)).empty());
  ASSERT_EQ(jobs_.Resizable().size(), 1u);

  // 60 s in all: asked for its last checkpoint, once; no longer offered a resize.
  clock_.AdvanceMs(1);
  EXPECT_EQ(jobs_.CheckTimeLimits(clock_.WallNowMs()), std::vector<std::string>{"j1"});
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  const auto asked = CheckpointOrders(OrdersFor("n1", listed));
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].reason(), "time limit reached");
  EXPECT_EQ(State("j1"), v1::RUNNING);
  EXPECT_EQ(
      jobs_.Find("j1")->reason(),
      "time limit of 1m00s reached (resources.time_limit_minutes): stopping at the checkpoint "
      "asked for now");
  EXPECT_TRUE(jobs_.Resizable().empty());
  EXPECT_FALSE(jobs_.PlanResize("j1", ResizePlan{4, {}}));

  clock_.AdvanceMs(2000);
  jobs_.OnCheckpoint(Checkpoint("j1", 2, 8));
  EXPECT_EQ(State("j1"), v1::FAILED);
  EXPECT_EQ(jobs_.Find("j1")->restarts(), 1);
  EXPECT_EQ(jobs_.Find("j1")->reason(),
            "time limit reached: it ran 1m02s of its 1m00s (resources.time_limit_minutes); "
            "stopped at the checkpoint of step 8 (/ckpt/step_8): a job submitted again with the "
            "same checkpoint.dir goes on from it");
  EXPECT_EQ(jobs_.Attempts("j1").back().end_reason(), "time limit reached");
  EXPECT_EQ(batches_.back().jobs.back().state(), v1::FAILED);
  EXPECT_EQ(batches_.back().jobs.back().latest_checkpoint_step(), 8);
  ASSERT_EQ(batches_.back().attempts.size(), 1u);
  EXPECT_EQ(batches_.back().attempts[0].ended_ms(), clock_.WallNowMs());
  EXPECT_EQ(ended_.back(), (std::pair<std::string, int64_t>{"j1", 2}));
  const auto stops = StopOrders(OrdersFor("n1", listed));
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].reason(), "time limit reached");
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());  // finished: left alone
}

TEST_F(JobManagerTest, OutOfTimeAJobStopsAtOnceWithoutCheckpointsOrWhenTheOneAskedForDoesNotCome) {
  ASSERT_TRUE(Submit(TimeLimitedSpec(1, 1, "checkpoint: {every_steps: 0}\n"), "none", 1).ok());
  ASSERT_TRUE(Submit(TimeLimitedSpec(1, 1), "late", 2).ok());
  ASSERT_TRUE(Submit(TimeLimitedSpec(1, 1), "fails", 3).ok());
  ASSERT_TRUE(Submit(SpecYaml(1, 1), "unlimited", 4).ok());
  for (const char* id : {"none", "late", "fails", "unlimited"}) Place(id, 1, {Node(id, 1)});
  clock_.AdvanceMs(60'000);
  EXPECT_EQ(jobs_.CheckTimeLimits(clock_.WallNowMs()), (std::vector<std::string>{"late", "fails"}));
  EXPECT_EQ(State("none"), v1::FAILED);
  EXPECT_EQ(jobs_.Find("none")->reason(),
            "time limit reached: it ran 1m00s of its 1m00s (resources.time_limit_minutes); "
            "stopped at once (it saves no checkpoints)");
  EXPECT_EQ(State("unlimited"), v1::RUNNING);
  EXPECT_EQ(jobs_.Find("unlimited")->reason(), "");

  // A failure once its time is used up: not restarted, whatever restarts are left.
  jobs_.OnTrainerStatus("fails", Exited("fails", 1, 0, 1));
  EXPECT_EQ(State("fails"), v1::FAILED);
  EXPECT_EQ(jobs_.Find("fails")->restarts(), 0);
  EXPECT_EQ(jobs_.Find("fails")->reason(),
            "attempt 1 failed: rank 0 on fails exited with code 1; not restarted: time limit "
            "reached: it ran 1m00s of its 1m00s (resources.time_limit_minutes)");

  // The checkpoint asked for is waited for as long as a step may take (hang_timeout_s 120).
  jobs_.OnCheckpoint(Checkpoint("late", 1, 3));  // an older one may come first...
  EXPECT_EQ(State("late"), v1::FAILED);          // ...and is where it stops
  ASSERT_TRUE(Submit(TimeLimitedSpec(1, 1), "hung", 5).ok());
  Place("hung", 1, {Node("hung", 1)});
  jobs_.OnCheckpoint(Checkpoint("hung", 1, 2));
  clock_.AdvanceMs(60'000);
  EXPECT_EQ(jobs_.CheckTimeLimits(clock_.WallNowMs()), std::vector<std::string>{"hung"});
  clock_.AdvanceMs(119'999);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  EXPECT_EQ(State("hung"), v1::RUNNING);
  clock_.AdvanceMs(1);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  EXPECT_EQ(State("hung"), v1::FAILED);
  EXPECT_EQ(jobs_.Find("hung")->reason(),
            "time limit reached: it ran 3m00s of its 1m00s (resources.time_limit_minutes); "
            "stopped at once: the checkpoint asked for at the limit did not come within "
            "fault_tolerance.hang_timeout_s (2m00s); its newest complete checkpoint is of step 2");
  EXPECT_EQ(StopOrders(OrdersFor("hung", {Trainer("hung", 1, 0)})).size(), 1u);
}

TEST_F(JobManagerTest, ATimeLimitCountsNoSuspendedTimeAndOutlivesACoordinatorRestart) {
  ASSERT_TRUE(Submit(TimeLimitedSpec(1, 1), "j1", 1).ok());
  Place("j1", 1, {Node("n1", 1)});
  clock_.AdvanceMs(30'000);
  v1::SuspendJobRequest suspend;
  suspend.set_job_id("j1");
  suspend.set_now(true);
  auto plan = jobs_.PlanSuspend(suspend);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(jobs_.ApplyJobPlan(&*plan));
  ASSERT_EQ(State("j1"), v1::SUSPENDED);
  clock_.AdvanceMs(3'600'000);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  auto resume = jobs_.PlanResume("j1");
  ASSERT_TRUE(resume.ok() && jobs_.ApplyJobPlan(&*resume));
  Place("j1", 1, {Node("n1", 1)});
  clock_.AdvanceMs(29'000);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());

  // A restarted coordinator counts from the attempts it stored, and asks for the checkpoint.
  JobManager restored(&clock_, {}, {});
  restored.Restore({*jobs_.Find("j1")}, jobs_.Attempts("j1"));
  EXPECT_TRUE(restored.CheckTimeLimits(clock_.WallNowMs()).empty());
  clock_.AdvanceMs(1000);
  EXPECT_EQ(restored.CheckTimeLimits(clock_.WallNowMs()), std::vector<std::string>{"j1"});
  JobManager::Orders orders;
  restored.AppendOrders("n1", {Trainer("j1", 2, 0)}, &orders);
  const auto asked = CheckpointOrders({orders.begin(), orders.end()});
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].reason(), "time limit reached");
}

TEST_F(JobManagerTest, AJobWaitingWithItsTimeUsedUpFailsWithoutAnotherPlacement) {
  ASSERT_TRUE(Submit(TimeLimitedSpec(2, 1), "j1", 1).ok());
  Place("j1", 2, {Node("n1", 2)});
  // A grow planned before the limit happens just after it, before the next check.
  jobs_.PlanResize("j1", ResizePlan{4, {}});
  clock_.AdvanceMs(61'000);
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 4));
  ASSERT_EQ(State("j1"), v1::RECOVERING);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  EXPECT_EQ(State("j1"), v1::FAILED);
  EXPECT_EQ(jobs_.Find("j1")->reason(),
            "time limit reached: it ran 1m01s of its 1m00s (resources.time_limit_minutes); "
            "not placed again");
  EXPECT_TRUE(jobs_.Pending().empty());
}

TEST_F(JobManagerTest, ATimeLimitChangedInTheSpecLetsAJobStoppingAtTheOldOneTrainOn) {
  ASSERT_TRUE(Submit(TimeLimitedSpec(1, 1), "j1", 1).ok());
  Place("j1", 1, {Node("n1", 1)});
  clock_.AdvanceMs(60'000);
  ASSERT_EQ(jobs_.CheckTimeLimits(clock_.WallNowMs()), std::vector<std::string>{"j1"});
  EXPECT_EQ(jobs_.PlanTimeLimit("nope", 2).status().code(), StatusCode::kNotFound);
  auto bad = jobs_.PlanTimeLimit("j1", -1);
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("resources.time_limit_minutes"), std::string::npos)
      << bad.status();

  // Planned, nothing changes; the plan holds the record to write, with the new limit.
  auto plan = jobs_.PlanTimeLimit("j1", 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->change, JobManager::JobPlan::kTimeLimit);
  EXPECT_EQ(plan->previous_minutes, 1);
  EXPECT_EQ(plan->ran_ms, 60'000);
  ASSERT_EQ(plan->batch.jobs.size(), 1u);
  auto written = ParseJobSpec(plan->batch.jobs[0].spec_yaml());
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->resources.time_limit_minutes, 2);
  EXPECT_EQ(jobs_.SpecOf("j1")->resources.time_limit_minutes, 1);
  ASSERT_TRUE(jobs_.ApplyJobPlan(&*plan));
  EXPECT_EQ(jobs_.SpecOf("j1")->resources.time_limit_minutes, 2);
  EXPECT_EQ(jobs_.Find("j1")->spec_yaml(), plan->batch.jobs[0].spec_yaml());
  EXPECT_EQ(jobs_.Find("j1")->reason(), "");
  // The checkpoint asked for at the old limit is saved, and the job trains on.
  jobs_.OnCheckpoint(Checkpoint("j1", 1, 5));
  EXPECT_EQ(State("j1"), v1::RUNNING);
  EXPECT_EQ(jobs_.PlanTimeLimit("j1", 2)->change, JobManager::JobPlan::kNone);

  // A coordinator restarted from the record has the new limit.
  JobManager restored(&clock_, {}, {});
  restored.Restore({*jobs_.Find("j1")}, jobs_.Attempts("j1"));
  EXPECT_EQ(restored.SpecOf("j1")->resources.time_limit_minutes, 2);
  clock_.AdvanceMs(59'999);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  EXPECT_TRUE(restored.CheckTimeLimits(clock_.WallNowMs()).empty());
  clock_.AdvanceMs(1);
  EXPECT_EQ(restored.CheckTimeLimits(clock_.WallNowMs()), std::vector<std::string>{"j1"});

  // Lifted (0): no limit, whatever it has run.
  plan = jobs_.PlanTimeLimit("j1", 0);
  ASSERT_TRUE(plan.ok() && jobs_.ApplyJobPlan(&*plan));
  clock_.AdvanceMs(3'600'000);
  EXPECT_TRUE(jobs_.CheckTimeLimits(clock_.WallNowMs()).empty());
  EXPECT_EQ(State("j1"), v1::RUNNING);
  // A stale plan changes nothing; a finished job's limit cannot change.
  plan = jobs_.PlanTimeLimit("j1", 5);
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(Cancel("j1").ok());
  EXPECT_FALSE(jobs_.ApplyJobPlan(&*plan));
  EXPECT_EQ(jobs_.SpecOf("j1")->resources.time_limit_minutes, 0);
  EXPECT_EQ(jobs_.PlanTimeLimit("j1", 5).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(JobManagerTest, ListPagesGoNewestFirstWithoutSpecsAndFilter) {
  for (int i = 1; i <= 5; ++i) {
    std::string id = "j";  // not "j" + to_string: GCC 12 warns (-Wrestrict) falsely
    id += std::to_string(i);
    ASSERT_TRUE(Submit(SpecYaml(1, 1), id, i).ok());
  }
  Place("j2", 1, {Node("n1", 1)});
  v1::ListJobsRequest req;
  req.set_limit(2);
  v1::ListJobsResponse page = jobs_.ListPage(req);
  ASSERT_EQ(page.jobs_size(), 2);
  EXPECT_EQ(page.jobs(0).job_id(), "j5");
  EXPECT_EQ(page.jobs(1).job_id(), "j4");
  EXPECT_TRUE(page.jobs(0).spec_yaml().empty());
  EXPECT_FALSE(jobs_.Find("j5")->spec_yaml().empty());  // GetJob still has it
  std::vector<std::string> all;
  for (int pages = 0; pages < 10; ++pages) {
    for (const auto& j : page.jobs()) all.push_back(j.job_id());
    if (page.next_before_seq() == 0) break;
    req.set_before_seq(page.next_before_seq());
    page = jobs_.ListPage(req);
  }
  EXPECT_EQ(all, (std::vector<std::string>{"j5", "j4", "j3", "j2", "j1"}));
  v1::ListJobsRequest running;
  running.add_states(v1::RUNNING);
  page = jobs_.ListPage(running);
  ASSERT_EQ(page.jobs_size(), 1);
  EXPECT_EQ(page.jobs(0).job_id(), "j2");
  EXPECT_EQ(page.next_before_seq(), 0);
  v1::ListJobsRequest named;
  named.set_name("nobody");
  EXPECT_EQ(jobs_.ListPage(named).jobs_size(), 0);
}

// The live-job index (what the scheduler, live-state lists and counts walk instead of the
// whole history) agrees with a walk over every job through submits, placement, cancels,
// removal and a restore from the persisted records.
TEST_F(JobManagerTest, LiveJobIndexAgreesWithTheWholeHistory) {
  for (int i = 1; i <= 6; ++i) {
    std::string id = "j";
    id += std::to_string(i);
    ASSERT_TRUE(Submit(SpecYaml(1, 1), id, i).ok());
  }
  Place("j2", 1, {Node("n1", 1)});
  ASSERT_EQ(*Cancel("j3"), v1::CANCELLED);
  ASSERT_EQ(*Cancel("j4"), v1::CANCELLED);
  ASSERT_TRUE(jobs_.Remove("j4"));
  auto check = [](JobManager& jobs) {
    std::map<v1::JobState, int64_t> walked;
    const v1::ListJobsResponse all = jobs.ListPage({});
    for (const auto& j : all.jobs()) ++walked[j.state()];
    EXPECT_EQ(jobs.CountByState(), walked);
    v1::ListJobsRequest live;
    live.add_states(v1::PENDING);
    live.add_states(v1::RUNNING);
    std::vector<std::string> ids;
    const v1::ListJobsResponse live_page = jobs.ListPage(live);
    for (const auto& j : live_page.jobs()) ids.push_back(j.job_id());
    EXPECT_EQ(ids, (std::vector<std::string>{"j6", "j5", "j2", "j1"}));
    std::vector<std::string> pending;
    for (const PendingJob& p : jobs.Pending()) pending.push_back(p.job_id);
    std::sort(pending.begin(), pending.end());
    EXPECT_EQ(pending, (std::vector<std::string>{"j1", "j5", "j6"}));
  };
  check(jobs_);
  EXPECT_EQ(jobs_.CountByState()[v1::CANCELLED], 1);
  // A restarted coordinator rebuilds the index from the records.
  std::vector<v1::JobRecord> records;
  const v1::ListJobsResponse all = jobs_.ListPage({});
  for (const auto& j : all.jobs()) records.push_back(*jobs_.Find(j.job_id()));
  JobManager restored(&clock_, {}, {});
  restored.Restore(records, {});
  check(restored);
}

TEST_F(JobManagerTest, OversizedSpecIsRefusedWithItsSizeAndTheLimit) {
  const std::string padded = SpecYaml(1, 1) + "# " + std::string(300 * 1024, 'x') + "\n";
  auto job = jobs_.PrepareSubmit(padded, 0, "big", 1);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("the job spec is " + std::to_string(padded.size()) +
                                        " bytes; at most 262144 are accepted"),
            std::string::npos)
      << job.status();
}

}  // namespace
}  // namespace drover::coordinator
