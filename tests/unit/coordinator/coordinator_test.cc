#include "coordinator/coordinator.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "common/exit_codes.h"
#include "coordinator/server.h"
#include "coordinator/store/sqlite_store.h"
#include "proto/drover.grpc.pb.h"
#include "tests/unit/coordinator/fault_injection_store.h"
#include "tests/unit/coordinator/test_util.h"

namespace drover::coordinator {
namespace {

using testing::DiskFull;
using testing::Exited;
using testing::FaultInjectionStore;
using ::testing::HasSubstr;
using testing::RegisterReq;
using testing::SpecYaml;
using testing::Trainer;

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() {
    options_.state_dir = ::testing::TempDir() + "/drover_coord_" + std::to_string(getpid()) + "_" +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(options_.state_dir);
    Reopen();
  }
  void Reopen() {
    c_.reset();
    auto c = Coordinator::Open(options_, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
  }
  // Reopens on the same state.db behind a FaultInjectionStore (store_), with a fatal hook
  // that records instead of exiting.
  void ReopenWithFaults() {
    c_.reset();
    auto sqlite = SqliteStore::Open(options_.state_dir + "/state.db");
    ASSERT_TRUE(sqlite.ok()) << sqlite.status();
    auto store = std::make_unique<FaultInjectionStore>(std::move(*sqlite));
    store_ = store.get();
    CoordinatorDeps deps;
    deps.store = std::move(store);
    deps.fatal = [this](const Status& st) {
      std::lock_guard<std::mutex> lock(fatal_mu_);
      fatal_.push_back(st);
    };
    auto c = Coordinator::Open(options_, &clock_, std::move(deps));
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
  }
  std::vector<Status> Fatal() {
    std::lock_guard<std::mutex> lock(fatal_mu_);
    return fatal_;
  }
  std::vector<std::string> JobIds() {
    std::vector<std::string> ids;
    const v1::ListJobsResponse listed = c_->ListJobs();
    for (const auto& j : listed.jobs()) ids.push_back(j.job_id());
    std::reverse(ids.begin(), ids.end());  // listed newest first; here in submit order
    return ids;
  }
  std::string Submit(const std::string& yaml, int priority = 0) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_priority(priority);
    auto id = c_->SubmitJob(req);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }
  // A heartbeat once every change so far is durable (start orders wait for their attempt's
  // record to be written; a live agent is nudged when it is).
  v1::HeartbeatResponse Beat(const std::string& node, std::vector<v1::TrainerStatus> trainers,
                             const std::string& agent = "agent-1") {
    (void)c_->Flush();  // an error here is what the test is about, if any
    return BeatNow(node, std::move(trainers), agent);
  }
  v1::HeartbeatResponse BeatNow(const std::string& node, std::vector<v1::TrainerStatus> trainers,
                                const std::string& agent = "agent-1") {
    v1::HeartbeatRequest hb;
    hb.set_name(node);
    hb.set_agent_id(agent);
    for (auto& t : trainers) *hb.add_trainers() = t;
    return c_->Heartbeat(hb);
  }
  v1::JobRecord Job(const std::string& id) { return c_->GetJob(id)->job(); }

  FakeClock clock_;
  CoordinatorOptions options_;
  FaultInjectionStore* store_ = nullptr;  // owned by c_, after ReopenWithFaults()
  std::mutex fatal_mu_;
  std::vector<Status> fatal_;  // GUARDED_BY(fatal_mu_)
  std::unique_ptr<Coordinator> c_;
};

TEST_F(CoordinatorTest, NodeDeathRecoversOnHealthySlotsAfterSurvivorsExit) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  ASSERT_TRUE(c_->Register(RegisterReq("n2", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 2));
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  ASSERT_EQ(Job(id).placement_size(), 2);
  EXPECT_EQ(Beat("n1", {}).orders(0).start().rank(), 0);
  EXPECT_EQ(Beat("n2", {}).orders(0).start().rank(), 1);
  Beat("n1", {Trainer(id, 1, 0)});
  Beat("n2", {Trainer(id, 1, 1)});

  // n1 keeps heartbeating, n2 goes silent: dead after 3 s, not before.
  for (int i = 0; i < 3; ++i) {
    clock_.AdvanceMs(999);
    Beat("n1", {Trainer(id, 1, 0)});
    c_->Tick();
  }
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  clock_.AdvanceMs(3);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_EQ(Job(id).restarts(), 1);

  // The survivor is stopped; its slot stays busy until the agent says it exited.
  auto resp = Beat("n1", {Trainer(id, 1, 0)});
  ASSERT_EQ(resp.orders_size(), 1);
  EXPECT_EQ(resp.orders(0).stop().attempt(), 1);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  Beat("n1", {Exited(id, 1, 0, 0, 15)});
  c_->Tick();
  // Elastic: attempt 2 shrinks to the one healthy slot.
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
  EXPECT_EQ(Job(id).placement_size(), 1);
  EXPECT_EQ(Job(id).placement(0).node(), "n1");
  // A copy: ListWorkers() returns a temporary.
  const v1::NodeRecord n2 = c_->ListWorkers().workers(1).node();
  EXPECT_EQ(n2.state(), v1::NODE_DEAD);
  EXPECT_EQ(n2.failures(), 1);
}

// A rank fails on a node that stays healthy: the job restarts on all three slots once the
// stopped survivors have exited, not at once on the one slot free and then at 3 ranks again
// at its next checkpoint. A survivor that does not exit holds it back for the stop grace
// and a second at most.
TEST_F(CoordinatorTest, AFailedJobRestartsOnTheSlotsItsSurvivorsGiveBackNotSmallerAtOnce) {
  for (const char* n : {"n1", "n2", "n3"}) ASSERT_TRUE(c_->Register(RegisterReq(n, 1)).ok());
  const std::string id = Submit(SpecYaml(2, 3, 5));
  c_->Tick();
  ASSERT_EQ(Job(id).placement_size(), 3);
  for (int r = 0; r < 3; ++r)
    Beat(std::string("n").append(std::to_string(r + 1)), {Trainer(id, 1, r)});

  Beat("n2", {Exited(id, 1, 1, 1)});  // rank 1 fails; n2 stays healthy
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_EQ(Job(id).reason(),
            "attempt 1 failed: rank 1 on n2 exited with code 1; restart 1 of 5; waiting for the "
            "2 cpu slots its stopped trainers still hold (1 free now), to restart at 3 ranks")
      << "n2's slot is free; n1 and n3 still run their stopped ranks";
  Beat("n1", {Exited(id, 1, 0, 0, 15)});
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING) << "placed at 2 ranks while n3's survivor exits";
  Beat("n3", {Exited(id, 1, 2, 0, 15)});
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
  EXPECT_EQ(Job(id).placement_size(), 3);
  for (int r = 0; r < 3; ++r)
    Beat(std::string("n").append(std::to_string(r + 1)), {Trainer(id, 2, r)});

  // Again, and n3's survivor does not exit: after the stop grace and a second, the job
  // takes the two slots it has.
  Beat("n2", {Exited(id, 2, 1, 1)});
  Beat("n1", {Exited(id, 2, 0, 0, 15)});
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  clock_.AdvanceMs(options_.stop_grace_ms + 999);
  Beat("n1", {});
  Beat("n2", {});
  Beat("n3", {Trainer(id, 2, 2)});
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  clock_.AdvanceMs(1);
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 3);
  EXPECT_EQ(Job(id).placement_size(), 2);
}

// drover suspend of a running job: it is asked for a checkpoint, stops at it (its trainers
// told to stop, its slot given back, no restart counted), stays SUSPENDED through a
// coordinator restart and until drover resume, and then resumes from that checkpoint.
TEST_F(CoordinatorTest, ASuspendedJobStopsAtItsCheckpointAndResumesFromItAfterResume) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1) + "checkpoint: {dir: /tmp/ck, every_steps: 100}\n");
  c_->Tick();
  ASSERT_EQ(Beat("n1", {}).orders_size(), 1);
  Beat("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 7)});

  v1::SuspendJobRequest request;
  request.set_job_id(id);
  request.set_reason("the Tuesday maintenance");
  request.set_requester("ops@h");
  auto asked = c_->SuspendJob(request);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->state(), v1::RUNNING);
  EXPECT_EQ(asked->after_step(), 7);
  EXPECT_EQ(Job(id).reason(),
            "suspending at its next checkpoint (drover suspend by ops@h: the Tuesday maintenance)");
  ASSERT_TRUE(c_->SuspendJob(request).ok()) << "repeating it is harmless";

  // Asked again after a coordinator restart: the request is durable.
  Reopen();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1, "agent-1")).ok());
  v1::HeartbeatResponse hb = Beat("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 8)});
  ASSERT_EQ(hb.orders_size(), 1);
  ASSERT_TRUE(hb.orders(0).has_checkpoint()) << hb.DebugString();

  v1::HeartbeatRequest ck;
  ck.set_name("n1");
  ck.set_agent_id("agent-1");
  *ck.add_trainers() = Trainer(id, 1, 0, v1::TRAINER_RUNNING, 9);
  v1::CheckpointRecord* c = ck.add_checkpoints();
  c->set_job_id(id);
  c->set_attempt(1);
  c->set_step(9);
  c->set_path("/tmp/ck/step_9");
  hb = c_->Heartbeat(ck);
  EXPECT_EQ(Job(id).state(), v1::SUSPENDED);
  EXPECT_EQ(Job(id).reason(), "suspended by ops@h: the Tuesday maintenance; drover resume " + id +
                                  " places it again");
  EXPECT_EQ(Job(id).restarts(), 0);
  EXPECT_EQ(c_->GetJob(id)->attempts(0).end_reason(),
            "suspended by ops@h: the Tuesday maintenance at the checkpoint of step 9");
  hb = Beat("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 9)});
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_TRUE(hb.orders(0).has_stop());
  Beat("n1", {Exited(id, 1, 0, 0, 15)});
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::SUSPENDED) << "placed again on its free slot";

  Reopen();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1, "agent-1")).ok());
  Beat("n1", {});
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::SUSPENDED);
  auto resumed = c_->ResumeJob(id);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, v1::PENDING);
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
  EXPECT_EQ(Job(id).restarts(), 0);
  hb = Beat("n1", {});
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).start().resume_checkpoint(), "/tmp/ck/step_9");
  EXPECT_EQ(*c_->ResumeJob(id), v1::RUNNING) << "a job not suspended is left as it is";
}

// A job waiting for slots is suspended at once and never placed until resumed; a running
// job that saves no checkpoints only with force, at once; a finished one not at all; and an
// attempt that fails while its job is suspending is not restarted.
TEST_F(CoordinatorTest, SuspendingWaitingJobsNoCheckpointJobsFinishedJobsAndFailingOnes) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string running = Submit(SpecYaml(1, 1) + "checkpoint: {every_steps: 0}\n");
  const std::string queued = Submit(SpecYaml(1, 1));
  c_->Tick();
  ASSERT_EQ(Job(running).state(), v1::RUNNING);
  ASSERT_EQ(Job(queued).state(), v1::PENDING);

  v1::SuspendJobRequest request;
  request.set_job_id(queued);
  auto r = c_->SuspendJob(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::SUSPENDED);
  EXPECT_EQ(Job(queued).reason(), "suspended; drover resume " + queued + " places it again");

  request.set_job_id(running);
  r = c_->SuspendJob(request);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("saves no checkpoints"));
  EXPECT_THAT(r.status().message(), HasSubstr("--now suspends it anyway"));
  EXPECT_EQ(Job(running).state(), v1::RUNNING);
  request.set_now(true);
  r = c_->SuspendJob(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::SUSPENDED);
  EXPECT_THAT(c_->GetJob(running)->attempts(0).end_reason(), HasSubstr("starts again from step 0"));
  Beat("n1", {Exited(running, 1, 0, 0, 15)});
  c_->Tick();
  EXPECT_EQ(Job(queued).state(), v1::SUSPENDED) << "a suspended job took the free slot";
  EXPECT_EQ(Job(running).state(), v1::SUSPENDED);

  ASSERT_EQ(*c_->ResumeJob(queued), v1::PENDING);
  c_->Tick();
  ASSERT_EQ(Job(queued).state(), v1::RUNNING);
  Beat("n1", {Exited(queued, 1, 0, 0)});
  c_->Tick();
  ASSERT_EQ(Job(queued).state(), v1::SUCCEEDED);
  request.set_job_id(queued);
  r = c_->SuspendJob(request);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();

  // Asked to suspend, it fails before its checkpoint: suspended, not restarted.
  const std::string ckpt =
      Submit(SpecYaml(1, 1, 5) + "checkpoint: {dir: /tmp/ck, every_steps: 9}\n");
  c_->Tick();
  ASSERT_EQ(Job(ckpt).state(), v1::RUNNING);
  request.set_job_id(ckpt);
  request.set_now(false);
  ASSERT_TRUE(c_->SuspendJob(request).ok());
  Beat("n1", {Exited(ckpt, 1, 0, 1)});
  c_->Tick();
  EXPECT_EQ(Job(ckpt).state(), v1::SUSPENDED);
  EXPECT_EQ(Job(ckpt).restarts(), 0);
  EXPECT_THAT(c_->GetJob(ckpt)->attempts(0).end_reason(), HasSubstr("exited with code 1"));
}

// An agent of another release (common/protocol_version.h: version 1 confirmed trainer leases
// with a rendezvous key this coordinator no longer honours) is refused, naming both
// versions, and does not become a node.
TEST_F(CoordinatorTest, AnAgentOfAnotherProtocolIsRefusedNamingBothVersions) {
  v1::RegisterRequest reg = RegisterReq("n1", 1);
  reg.set_protocol_version(1);
  const auto refused = c_->Register(reg);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "register: the agent speaks drover protocol 1 and this coordinator protocol " +
                std::to_string(kProtocolVersion) +
                " (common/protocol_version.h): run the agents and the coordinator of one "
                "release");
  const std::string id = Submit(SpecYaml(1, 1));
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::PENDING) << "the refused agent's slot was used";
  reg.set_protocol_version(kProtocolVersion);
  ASSERT_TRUE(c_->Register(reg).ok());
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
}

// A partition heals and TCP delivers a heartbeat the agent sent while cut off, after the
// heartbeats that followed it: the job's newest trainer on that node is not in its listing.
// Taken, that listing would fail the attempt ("rank 0 vanished from the agent"); it is
// older than what the coordinator knows, and ignored.
TEST_F(CoordinatorTest, AHeartbeatThatArrivesLateChangesNothing) {
  v1::RegisterRequest reg = RegisterReq("n1", 1);
  reg.set_seq(1);
  ASSERT_TRUE(c_->Register(reg).ok());
  const std::string id = Submit(SpecYaml(1, 1));
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  auto beat = [&](int64_t seq, std::vector<v1::TrainerStatus> trainers) {
    (void)c_->Flush();
    v1::HeartbeatRequest hb;
    hb.set_name("n1");
    hb.set_agent_id("agent-1");
    hb.set_seq(seq);
    for (auto& t : trainers) *hb.add_trainers() = t;
    return c_->Heartbeat(hb);
  };
  ASSERT_EQ(beat(2, {}).orders_size(), 1);
  beat(4, {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 3)});
  // Seq 3, sent before the trainer started, arrives now: no orders, no failure.
  EXPECT_EQ(beat(3, {}).orders_size(), 0);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING) << Job(id).reason();
  EXPECT_EQ(Job(id).attempt(), 1);
  EXPECT_EQ(c_->GetJob(id)->trainers_size(), 1);
  // A late registration of the same agent is refused and changes nothing either.
  reg.set_seq(2);
  EXPECT_FALSE(c_->Register(reg).ok());
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING) << Job(id).reason();
  // The next heartbeat in order is taken: the trainer's exit is seen.
  beat(5, {Exited(id, 1, 0, 0)});
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::SUCCEEDED);
}

TEST_F(CoordinatorTest, TrainerExitReportedAtOnceAndCheckpointResumed) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string id = Submit(SpecYaml(2, 2));
  c_->Tick();
  Beat("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("agent-1");
  *hb.add_trainers() = Trainer(id, 1, 0, v1::TRAINER_RUNNING, 50);
  *hb.add_trainers() = Trainer(id, 1, 1, v1::TRAINER_RUNNING, 50);
  v1::CheckpointRecord* ck = hb.add_checkpoints();
  ck->set_job_id(id);
  ck->set_attempt(1);
  ck->set_step(50);
  ck->set_path("/runs/ck/step_50");
  c_->Heartbeat(hb);
  c_->Heartbeat(hb);  // re-sent: ignored as a duplicate
  EXPECT_EQ(c_->GetJob(id)->checkpoints_size(), 1);
  EXPECT_EQ(Job(id).latest_checkpoint_step(), 50);

  v1::TrainerExitRequest exit;
  exit.set_name("n1");
  exit.set_agent_id("agent-1");
  *exit.mutable_trainer() = Exited(id, 1, 1, 0, 9);
  ASSERT_TRUE(c_->ReportTrainerExit(exit).ok());
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  Beat("n1", {Exited(id, 1, 0, 0, 15), Exited(id, 1, 1, 0, 9)});
  c_->Tick();
  ASSERT_EQ(Job(id).attempt(), 2);
  auto resp = Beat("n1", {});
  ASSERT_EQ(resp.orders_size(), 2);
  EXPECT_EQ(resp.orders(0).start().resume_checkpoint(), "/runs/ck/step_50");
}

TEST_F(CoordinatorTest, QueuedJobStartsAtTheNextTickAfterSlotsFree) {
  // Scheduling passes run on events, not on every tick: each way a slot frees must wake
  // the scheduler, so the queued job starts at the very next tick (no fallback delay).
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string a = Submit(SpecYaml(1, 1));
  c_->Tick();
  ASSERT_EQ(Job(a).state(), v1::RUNNING);
  const std::string b = Submit(SpecYaml(1, 1));
  c_->Tick();
  EXPECT_EQ(Job(b).state(), v1::PENDING);
  Beat("n1", {Trainer(a, 1, 0)});
  c_->Tick();
  EXPECT_EQ(Job(b).state(), v1::PENDING);

  // A's trainer exits 0, reported at once: A succeeds, B starts at the next tick.
  v1::TrainerExitRequest exit;
  exit.set_name("n1");
  exit.set_agent_id("agent-1");
  *exit.mutable_trainer() = Exited(a, 1, 0, 0);
  ASSERT_TRUE(c_->ReportTrainerExit(exit).ok());
  EXPECT_EQ(Job(a).state(), v1::SUCCEEDED);
  c_->Tick();
  ASSERT_EQ(Job(b).state(), v1::RUNNING);
  Beat("n1", {Trainer(b, 1, 0)});

  // C waits behind B. B is cancelled; its trainer holds the slot until the agent lists it
  // as exited in a heartbeat (no exit report this time): then C starts at the next tick.
  const std::string cj = Submit(SpecYaml(1, 1));
  c_->Tick();
  ASSERT_TRUE(c_->CancelJob(b).ok());
  c_->Tick();
  EXPECT_EQ(Job(cj).state(), v1::PENDING);  // B's trainer is still listed live
  Beat("n1", {Exited(b, 1, 0, 0, 15)});
  c_->Tick();
  EXPECT_EQ(Job(cj).state(), v1::RUNNING);
}

// A heartbeat from `node` listing `trainers` and reporting the complete checkpoint of
// `step` of `job`'s `attempt`.
v1::HeartbeatRequest CheckpointBeat(const std::string& node, const std::string& job,
                                    int64_t attempt, int64_t step,
                                    const std::vector<v1::TrainerStatus>& trainers) {
  v1::HeartbeatRequest hb;
  hb.set_name(node);
  hb.set_agent_id("agent-1");
  for (const auto& t : trainers) *hb.add_trainers() = t;
  v1::CheckpointRecord* ck = hb.add_checkpoints();
  ck->set_job_id(job);
  ck->set_attempt(attempt);
  ck->set_step(step);
  ck->set_path("/runs/ck/step_" + std::to_string(step));
  return hb;
}

std::vector<v1::TrainerStatus> Ranks(const std::string& job, int64_t attempt, int n,
                                     int64_t step = 4) {
  std::vector<v1::TrainerStatus> out;
  for (int r = 0; r < n; ++r) out.push_back(Trainer(job, attempt, r, v1::TRAINER_RUNNING, step));
  return out;
}

std::vector<v1::TrainerStatus> Stopped(const std::string& job, int64_t attempt, int n) {
  std::vector<v1::TrainerStatus> out;
  for (int r = 0; r < n; ++r) out.push_back(Exited(job, attempt, r, 0, 15));
  return out;
}

// SpecYaml with resources.time_limit_minutes.
std::string WithTimeLimit(std::string yaml, double minutes) {
  const std::string key = "world_size:";
  return yaml.insert(yaml.find(key), "time_limit_minutes: " + std::to_string(minutes) + ", ");
}

// Backfill: on a 3-slot node where a job with a 30-minute limit holds 2 slots, a 3-slot job
// waits for them. Behind it, a job without a limit and one of 60 minutes wait (they could
// hold a slot past those 30 minutes); one of 10 minutes starts at once on the free slot,
// saying why. Once the 3-slot job starts, nothing starts ahead of the queue any more.
TEST_F(CoordinatorTest, AJobWhoseTimeLimitEndsFirstStartsAheadOfOneWaitingForSlots) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 3)).ok());
  const std::string running = Submit(WithTimeLimit(SpecYaml(2, 2), 30));
  c_->Tick();
  ASSERT_EQ(Job(running).state(), v1::RUNNING);
  Beat("n1", Ranks(running, 1, 2));
  const std::string big = Submit(SpecYaml(3, 3));
  const std::string open = Submit(SpecYaml(1, 1));
  const std::string hour = Submit(WithTimeLimit(SpecYaml(1, 1), 60));
  const std::string ten = Submit(WithTimeLimit(SpecYaml(1, 1), 10));
  c_->Tick();
  EXPECT_EQ(Job(big).state(), v1::PENDING);
  EXPECT_EQ(Job(open).state(), v1::PENDING);
  EXPECT_EQ(Job(hour).state(), v1::PENDING);
  ASSERT_EQ(Job(ten).state(), v1::RUNNING);
  EXPECT_NE(Job(ten).reason().find("started before " + big +
                                   ", which waits for slots, by backfill: its time limit ends "
                                   "before that job can start"),
            std::string::npos)
      << Job(ten).reason();
  EXPECT_NE(Job(open).reason().find("queued behind"), std::string::npos) << Job(open).reason();
}

// Where lower-priority jobs are giving way to the waiting job (preemption), nothing backfills:
// the job that would, of lower priority too, would only be the next to give way.
TEST_F(CoordinatorTest, NothingBackfillsWhereLowerPriorityJobsMakeRoomForTheWaitingOne) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 3)).ok());
  const std::string low = Submit(WithTimeLimit(SpecYaml(2, 2), 30));
  c_->Tick();
  ASSERT_EQ(Job(low).state(), v1::RUNNING);
  Beat("n1", Ranks(low, 1, 2));
  const std::string high = Submit(SpecYaml(3, 3), 5);
  const std::string ten = Submit(WithTimeLimit(SpecYaml(1, 1), 10));
  c_->Tick();
  EXPECT_EQ(Job(high).state(), v1::PENDING);
  EXPECT_NE(Job(high).reason().find("lower-priority jobs make room"), std::string::npos)
      << Job(high).reason();
  EXPECT_EQ(Job(ten).state(), v1::PENDING) << Job(ten).reason();
}

// drover suspend --now: a running job whose training went wrong stops at once, without the
// checkpoint that would keep what went wrong; it resumes from its newest one. It also
// hurries a job that waits for its checkpoint.
TEST_F(CoordinatorTest, SuspendNowStopsAtOnceAndResumesFromTheNewestCheckpoint) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1) + "checkpoint: {dir: /tmp/ck, every_steps: 5}\n");
  c_->Tick();
  ASSERT_EQ(Beat("n1", {}).orders_size(), 1);
  c_->Heartbeat(CheckpointBeat("n1", id, 1, 5, {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 7)}));
  ASSERT_EQ(Job(id).latest_checkpoint_step(), 5);

  v1::SuspendJobRequest request;
  request.set_job_id(id);
  request.set_requester("ops@h");
  ASSERT_TRUE(c_->SuspendJob(request).ok());
  EXPECT_EQ(Job(id).state(), v1::RUNNING) << "waits for its checkpoint";
  request.set_now(true);
  request.set_reason("loss spiked");
  auto r = c_->SuspendJob(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::SUSPENDED) << "hurried";
  EXPECT_EQ(c_->GetJob(id)->attempts(0).end_reason(),
            "suspended by ops@h: loss spiked at once (it resumes from its newest complete "
            "checkpoint, of step 5)");
  v1::HeartbeatResponse hb = Beat("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 8)});
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_TRUE(hb.orders(0).has_stop()) << hb.DebugString();
  Beat("n1", {Exited(id, 1, 0, 0, 15)});
  ASSERT_EQ(*c_->ResumeJob(id), v1::PENDING);
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  hb = Beat("n1", {});
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).start().resume_checkpoint(), "/runs/ck/step_5");
}

TEST_F(CoordinatorTest, LowerPriorityJobShrinksAtItsNextCheckpointToMakeRoom) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 4)).ok());
  const std::string low = Submit(SpecYaml(2, 4));
  c_->Tick();
  ASSERT_EQ(Job(low).placement_size(), 4);
  Beat("n1", Ranks(low, 1, 4, 1));

  const std::string high = Submit(SpecYaml(2, 2), 5);
  c_->Tick();
  EXPECT_EQ(Job(high).state(), v1::PENDING);
  EXPECT_EQ(Job(high).reason(),
            "waiting for 2 free cpu slots (0 free); lower-priority jobs make room at their next "
            "checkpoints: " +
                low);
  EXPECT_EQ(Job(low).reason(),
            "shrinking to 2 ranks for job " + high + " (priority 5) at its next checkpoint");

  // The checkpoint ends the attempt; until its trainers have stopped, their slots count as
  // coming back, so nothing more is preempted and nothing is placed on them.
  c_->Heartbeat(CheckpointBeat("n1", low, 1, 4, Ranks(low, 1, 4)));
  EXPECT_EQ(Job(low).state(), v1::RECOVERING);
  EXPECT_EQ(Job(low).restarts(), 0);
  c_->Tick();
  EXPECT_EQ(Job(high).state(), v1::PENDING);
  EXPECT_EQ(Job(high).reason(), "waiting for 2 free cpu slots (0 free)");
  Beat("n1", Stopped(low, 1, 4));
  c_->Tick();
  ASSERT_EQ(Job(high).state(), v1::RUNNING);
  ASSERT_EQ(Job(low).state(), v1::RUNNING);
  EXPECT_EQ(Job(low).placement_size(), 2);
  const v1::JobInfo info = *c_->GetJob(low);
  EXPECT_EQ(info.attempts(0).end_reason(),
            "resized: shrinking from 4 to 2 ranks at the checkpoint of step 4 for job " + high +
                " (priority 5)");
  EXPECT_EQ(info.attempts(1).resume_step(), 4);
}

TEST_F(CoordinatorTest, LowerPriorityJobYieldsEverySlotAndResumesWhenTheyAreFree) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string low = Submit(SpecYaml(2, 2));
  c_->Tick();
  Beat("n1", Ranks(low, 1, 2, 1));
  const std::string high = Submit(SpecYaml(2, 2), 5);
  c_->Tick();
  EXPECT_EQ(Job(low).reason(),
            "yielding its slots for job " + high + " (priority 5) at its next checkpoint");

  c_->Heartbeat(CheckpointBeat("n1", low, 1, 4, Ranks(low, 1, 2)));
  Beat("n1", Stopped(low, 1, 2));
  c_->Tick();
  ASSERT_EQ(Job(high).state(), v1::RUNNING);
  EXPECT_EQ(Job(low).state(), v1::RECOVERING);
  EXPECT_EQ(Job(low).restarts(), 0);
  EXPECT_EQ(Job(low).reason(), "preempted by job " + high +
                                   " (priority 5) at the checkpoint of step 4; waiting for 2 "
                                   "free cpu slots (0 free)");
  // The high-priority job ends: the preempted one resumes from its checkpoint.
  Beat("n1", Ranks(high, 1, 2, 1));
  Beat("n1", {Exited(high, 1, 0, 0), Exited(high, 1, 1, 0)});
  ASSERT_EQ(Job(high).state(), v1::SUCCEEDED);
  c_->Tick();
  ASSERT_EQ(Job(low).state(), v1::RUNNING);
  EXPECT_EQ(Job(low).attempt(), 2);
  EXPECT_EQ(c_->GetJob(low)->attempts(1).resume_step(), 4);
}

// drover priority: a queued job raised above a running one makes it yield at its next
// checkpoint, as if submitted so; a job lowered again loses that; the priority is durable.
TEST_F(CoordinatorTest, ARaisedPriorityReordersTheQueueAndPreemptsLikeASubmittedOne) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string low = Submit(SpecYaml(2, 2));
  c_->Tick();
  Beat("n1", Ranks(low, 1, 2, 1));
  const std::string first = Submit(SpecYaml(2, 2));
  const std::string second = Submit(SpecYaml(2, 2));
  c_->Tick();
  EXPECT_EQ(Job(low).reason(), "") << "nothing above it";

  auto raised = c_->SetPriority(second, 5);
  ASSERT_TRUE(raised.ok()) << raised.status();
  EXPECT_EQ(raised->previous(), 0);
  EXPECT_EQ(raised->state(), v1::PENDING);
  c_->Tick();
  EXPECT_EQ(Job(low).reason(),
            "yielding its slots for job " + second + " (priority 5) at its next checkpoint");
  EXPECT_EQ(Job(first).reason(), "queued behind an earlier cpu job");

  Reopen();  // durable
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2, "agent-1")).ok());
  EXPECT_EQ(Job(second).priority(), 5);
  Beat("n1", Ranks(low, 1, 2, 3));
  c_->Heartbeat(CheckpointBeat("n1", low, 1, 4, Ranks(low, 1, 2)));
  Beat("n1", Stopped(low, 1, 2));
  c_->Tick();
  EXPECT_EQ(Job(second).state(), v1::RUNNING) << "before the job submitted before it";
  EXPECT_EQ(Job(first).state(), v1::PENDING);

  auto same = c_->SetPriority(second, 5);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->previous(), 5);
  EXPECT_EQ(c_->SetPriority("j-nope", 1).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(c_->CancelJob(second).ok());
  EXPECT_EQ(c_->SetPriority(second, 1).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, APreemptionIsWithdrawnWhenTheJobItWasForIsCancelled) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string low = Submit(SpecYaml(2, 2));
  c_->Tick();
  Beat("n1", Ranks(low, 1, 2, 1));
  const std::string high = Submit(SpecYaml(2, 2), 5);
  c_->Tick();
  ASSERT_NE(Job(low).reason(), "");
  ASSERT_TRUE(c_->CancelJob(high).ok());
  c_->Tick();
  EXPECT_EQ(Job(low).reason(), "");
  c_->Heartbeat(CheckpointBeat("n1", low, 1, 4, Ranks(low, 1, 2)));
  EXPECT_EQ(Job(low).state(), v1::RUNNING);
  EXPECT_EQ(Job(low).attempt(), 1);
}

TEST_F(CoordinatorTest, UnknownAgentIsToldToRegisterAgain) {
  EXPECT_TRUE(Beat("n1", {}).reregister());
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1, "a1")).ok());
  EXPECT_FALSE(Beat("n1", {}, "a1").reregister());
  EXPECT_TRUE(Beat("n1", {}, "a0").reregister());  // an older agent process
  EXPECT_EQ(c_->Register(RegisterReq("", 1)).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, LiveNodesNameIsRefusedToAnotherNodeButNotToItsRestartedAgent) {
  auto req = [](const std::string& agent, const std::string& uid) {
    v1::RegisterRequest r = RegisterReq("n1", 2, agent);
    r.set_node_uid(uid);
    return r;
  };
  ASSERT_TRUE(c_->Register(req("a1", "uid-A")).ok());
  // Another machine (another work dir) given the same --name while n1 lives: refused, and
  // n1 keeps its agent and its two slots.
  v1::RegisterRequest other = req("b1", "uid-B");
  other.clear_slots();
  other.add_slots()->set_index(0);
  auto refused = c_->Register(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(refused.status().message().find("node name 'n1' is held by a live agent (a1"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(Beat("n1", {}, "a1").reregister());
  EXPECT_EQ(c_->ListWorkers().workers(0).node().slots_size(), 2);
  // The same node's agent, restarted (new agent id, same uid), takes its name back.
  ASSERT_TRUE(c_->Register(req("a2", "uid-A")).ok());
  EXPECT_TRUE(Beat("n1", {}, "a1").reregister());
  // Once n1 is dead, its name may go to another node.
  clock_.AdvanceMs(60000);
  c_->Tick();
  ASSERT_TRUE(c_->Register(req("b2", "uid-B")).ok());
}

// A job's ranks found the node of rank 0 cut off from its peers (the trainers' peer check),
// and another rank reported it first: the attempt fails on the node named, not on the
// reporter's; that node is cordoned; the restart is not counted (no training was lost); and
// the next attempt runs on the others, smaller.
TEST_F(CoordinatorTest, ANodeItsPeersCannotReachIsCordonedAndTheJobShrinksAroundIt) {
  for (const char* n : {"n1", "n2", "n3"}) ASSERT_TRUE(c_->Register(RegisterReq(n, 1)).ok());
  const std::string id = Submit(SpecYaml(2, 3));
  c_->Tick();
  ASSERT_EQ(Job(id).placement_size(), 3);
  std::vector<std::string> node(3);
  for (int r = 0; r < 3; ++r) node[r] = Job(id).placement(r).node();
  for (int r = 0; r < 3; ++r) ASSERT_EQ(Beat(node[r], {}).orders_size(), 1);
  for (int r = 0; r < 3; ++r) Beat(node[r], {Trainer(id, 1, r)});

  v1::TrainerExitRequest exit;
  exit.set_name(node[2]);
  exit.set_agent_id("agent-1");
  *exit.mutable_trainer() = Exited(id, 1, 2, 1);
  exit.mutable_trainer()->mutable_progress()->add_cut_off_ranks(0);
  ASSERT_TRUE(c_->ReportTrainerExit(exit).ok());
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_NE(Job(id).reason().find("cut off: " + node[0]), std::string::npos) << Job(id).reason();
  EXPECT_EQ(Job(id).restarts(), 0);
  const v1::WorkerInfo* bad = nullptr;
  const v1::ListWorkersResponse workers = c_->ListWorkers();
  for (const auto& w : workers.workers()) {
    if (w.node().name() == node[0]) bad = &w;
  }
  ASSERT_NE(bad, nullptr);
  EXPECT_EQ(bad->node().state(), v1::NODE_CORDONED);
  EXPECT_EQ(bad->node().failures(), 1);
  EXPECT_GT(bad->node().cordon_until_ms(), clock_.WallNowMs());

  // The other ranks are stopped and exit; the next attempt leaves the cordoned node out.
  Beat(node[0], {Exited(id, 1, 0, 1)});
  Beat(node[1], {Exited(id, 1, 1, 0, 15)});
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING) << Job(id).reason();
  EXPECT_EQ(Job(id).attempt(), 2);
  const v1::JobRecord job = Job(id);
  ASSERT_EQ(job.placement_size(), 2);
  for (const auto& p : job.placement()) EXPECT_NE(p.node(), node[0]);
}

// A failure storm: every node of four misses its heartbeats twice (a switch, not the
// nodes). Half of them (--max-cordoned-share 0.5) are cordoned; the others, their second
// failure counted, are in use again as soon as they heartbeat, so a job still starts.
TEST_F(CoordinatorTest, AFailureStormCordonsAtMostTheCappedShareAndTheRestStayInUse) {
  const std::vector<std::string> names = {"n1", "n2", "n3", "n4"};
  for (int death = 0; death < 2; ++death) {
    for (const auto& n : names) ASSERT_TRUE(c_->Register(RegisterReq(n, 1)).ok());
    clock_.AdvanceMs(60000);
    c_->Tick();
  }
  int cordoned = 0;
  const v1::ListWorkersResponse stormed = c_->ListWorkers();
  for (const auto& w : stormed.workers()) {
    EXPECT_EQ(w.node().failures(), 2) << w.node().name();
    cordoned += w.node().cordon_until_ms() > clock_.WallNowMs() ? 1 : 0;
  }
  EXPECT_EQ(cordoned, 2);
  for (const auto& n : names) ASSERT_TRUE(c_->Register(RegisterReq(n, 1)).ok());
  int free_slots = 0;
  const v1::ListWorkersResponse back = c_->ListWorkers();
  for (const auto& w : back.workers()) free_slots += w.free_slots();
  EXPECT_EQ(free_slots, 2);
  const std::string id = Submit(SpecYaml(2, 2));
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING) << Job(id).reason();
}

TEST_F(CoordinatorTest, AGpuThatFailedIsCordonedAloneAndTheJobGoesOnOnTheNodesOthers) {
  ASSERT_TRUE(c_->Register(RegisterReq("g1", 3, "agent-1", v1::CUDA)).ok());
  const std::string id = Submit(SpecYaml(1, 3, 2, 120, "cuda"));
  c_->Tick();
  ASSERT_EQ(Job(id).placement_size(), 3);
  ASSERT_EQ(Beat("g1", {}).orders_size(), 3);
  Beat("g1", {Trainer(id, 1, 0), Trainer(id, 1, 1), Trainer(id, 1, 2)});
  const int slot = Job(id).placement(2).slot();

  v1::TrainerExitRequest exit;
  exit.set_name("g1");
  exit.set_agent_id("agent-1");
  *exit.mutable_trainer() = Exited(id, 1, 2, kExitDeviceFault);
  exit.mutable_trainer()->set_last_error("the GPU failed: cudaErrorECCUncorrectable");
  ASSERT_TRUE(c_->ReportTrainerExit(exit).ok());
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_EQ(Job(id).restarts(), 0);
  EXPECT_THAT(Job(id).reason(),
              HasSubstr("the GPU of g1 slot " + std::to_string(slot) + " failed"));
  v1::ListWorkersResponse workers = c_->ListWorkers();
  ASSERT_EQ(workers.workers_size(), 1);
  const v1::NodeRecord& node = workers.workers(0).node();
  EXPECT_EQ(node.state(), v1::NODE_ALIVE);
  ASSERT_EQ(node.slot_faults_size(), 1);
  EXPECT_EQ(node.slot_faults(0).slot(), slot);
  EXPECT_GT(node.slot_faults(0).cordon_until_ms(), workers.now_ms());
  EXPECT_THAT(node.slot_faults(0).reason(), HasSubstr("cudaErrorECCUncorrectable"));

  // The survivors exit; the next attempt takes the node's two other GPUs, not the failed one.
  Beat("g1", {Exited(id, 1, 0, 0, 15), Exited(id, 1, 1, 0, 15), Exited(id, 1, 2, 3)});
  c_->Tick();
  const v1::JobRecord next = Job(id);
  ASSERT_EQ(next.state(), v1::RUNNING) << next.reason();
  ASSERT_EQ(next.placement_size(), 2);
  for (const auto& p : next.placement()) EXPECT_NE(p.slot(), slot);
  workers = c_->ListWorkers();
  EXPECT_EQ(workers.workers(0).free_slots(), 0);  // two running, one cordoned
  // The cordon survives a coordinator restart, and ends on time (5 minutes by default).
  Reopen();
  workers = c_->ListWorkers();
  ASSERT_EQ(workers.workers(0).node().slot_faults_size(), 1);
  EXPECT_GT(workers.workers(0).node().slot_faults(0).cordon_until_ms(), clock_.WallNowMs());
  clock_.AdvanceMs(300'000);
  c_->Tick();
  ASSERT_TRUE(c_->Flush().ok());
  EXPECT_EQ(c_->ListWorkers().workers(0).node().slot_faults(0).cordon_until_ms(), 0);
}

// A GPU its agent's health check finds unfit, under a running job: the slot is cordoned at
// once and the attempt stopped (its restart not counted), the next attempt leaves the slot
// out for as long as the agent reports it, past its cordon; once the report ends it is
// back. A node that registers with a slot unfit never has it used.
TEST_F(CoordinatorTest, AGpuItsAgentFindsUnfitIsTakenOutUnderTheJobUntilItPassesAgain) {
  ASSERT_TRUE(c_->Register(RegisterReq("g1", 2, "agent-1", v1::CUDA)).ok());
  const std::string id = Submit(SpecYaml(1, 2, 2, /*hang_s=*/1000, "cuda"));
  c_->Tick();
  ASSERT_EQ(Beat("g1", {}).orders_size(), 2);
  Beat("g1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  const int slot = Job(id).placement(1).slot();

  v1::HeartbeatRequest hb;
  hb.set_name("g1");
  hb.set_agent_id("agent-1");
  *hb.add_trainers() = Trainer(id, 1, 0);
  *hb.add_trainers() = Trainer(id, 1, 1);
  v1::SlotHealth* unfit = hb.add_unhealthy_slots();
  unfit->set_slot(slot);
  unfit->set_fault("GPU 0000:19:00.0: 1 uncorrectable ECC error since its last reset (NVML)");
  c_->Heartbeat(hb);
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_EQ(Job(id).restarts(), 0);
  EXPECT_THAT(Job(id).reason(),
              HasSubstr("rank 1 on g1 slot " + std::to_string(slot) +
                        ": its GPU failed the node's health check: GPU 0000:19:00.0: 1 "
                        "uncorrectable ECC error"));
  v1::NodeRecord node = c_->ListWorkers().workers(0).node();
  ASSERT_EQ(node.slot_faults_size(), 1);
  EXPECT_EQ(node.slot_faults(0).failures(), 1);
  EXPECT_THAT(node.slot_faults(0).reason(), HasSubstr("the node's health check"));
  ASSERT_EQ(node.unhealthy_slots_size(), 1);

  // The survivors stopped, the next attempt takes the other GPU alone; reported again and
  // again, the slot is not cordoned again.
  hb.clear_trainers();
  *hb.add_trainers() = Exited(id, 1, 0, 0, 15);
  *hb.add_trainers() = Exited(id, 1, 1, 0, 15);
  c_->Heartbeat(hb);
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING) << Job(id).reason();
  ASSERT_EQ(Job(id).placement_size(), 1);
  EXPECT_NE(Job(id).placement(0).slot(), slot);
  hb.clear_trainers();
  *hb.add_trainers() = Trainer(id, 2, 0);
  c_->Heartbeat(hb);
  EXPECT_EQ(c_->ListWorkers().workers(0).node().slot_faults(0).failures(), 1);
  // Its cordon ends; reported still, it stays out.
  clock_.AdvanceMs(300'000);
  c_->Heartbeat(hb);
  c_->Tick();
  EXPECT_EQ(c_->ListWorkers().workers(0).free_slots(), 0);
  EXPECT_EQ(Job(id).placement_size(), 1);
  // Mended (reset): the report ends and the slot is free.
  hb.clear_unhealthy_slots();
  c_->Heartbeat(hb);
  EXPECT_EQ(c_->ListWorkers().workers(0).free_slots(), 1);

  // A node whose agent reports a slot unfit as it registers: that slot is never placed on.
  v1::RegisterRequest reg = RegisterReq("g2", 2, "agent-2", v1::CUDA);
  v1::SlotHealth* lost = reg.add_unhealthy_slots();
  lost->set_slot(0);
  lost->set_fault("GPU 0000:3b:00.0: it has fallen off the bus");
  ASSERT_TRUE(c_->Register(reg).ok());
  v1::ListWorkersResponse workers = c_->ListWorkers();
  ASSERT_EQ(workers.workers_size(), 2);
  EXPECT_EQ(workers.workers(1).free_slots(), 1);
  const std::string two = Submit(SpecYaml(2, 2, 2, 120, "cuda"));
  c_->Tick();
  const v1::JobRecord placed = Job(two);
  ASSERT_EQ(placed.state(), v1::RUNNING) << placed.reason();
  for (const auto& p : placed.placement()) {
    EXPECT_FALSE(p.node() == "g2" && p.slot() == 0) << "placed on the lost GPU";
  }
}

// An Xid's finding (a latch) through the service: drover uncordon of the slot puts it back at
// once, and every heartbeat reply carries the latch until the agent's report leaves it out,
// a lost reply included; a free slot takes the job's next rank meanwhile.
TEST_F(CoordinatorTest, AnUncordonedXidLatchGoesToTheAgentWithEveryReplyUntilItHeard) {
  ASSERT_TRUE(c_->Register(RegisterReq("g1", 2, "agent-1", v1::CUDA)).ok());
  v1::HeartbeatRequest hb;
  hb.set_name("g1");
  hb.set_agent_id("agent-1");
  v1::SlotHealth* xid = hb.add_unhealthy_slots();
  xid->set_slot(1);
  xid->set_fault("GPU 0000:19:00.0: Xid 79 (fallen off the bus)");
  xid->set_latch(4242);
  EXPECT_EQ(c_->Heartbeat(hb).cleared_latches_size(), 0);
  EXPECT_EQ(c_->ListWorkers().workers(0).free_slots(), 1);

  v1::UncordonRequest request;
  request.set_node("g1");
  request.set_slot_only(true);
  request.set_slot(1);
  auto done = c_->Uncordon(request);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->was_cordoned());
  EXPECT_EQ(c_->ListWorkers().workers(0).free_slots(), 2);
  for (int reply = 0; reply < 2; ++reply) {  // the first reply lost: the agent reports it again
    v1::HeartbeatResponse resp = c_->Heartbeat(hb);
    ASSERT_EQ(resp.cleared_latches_size(), 1);
    EXPECT_EQ(resp.cleared_latches(0), 4242);
    EXPECT_EQ(c_->ListWorkers().workers(0).free_slots(), 2);
  }
  hb.clear_unhealthy_slots();
  EXPECT_EQ(c_->Heartbeat(hb).cleared_latches_size(), 0);
  const std::string id = Submit(SpecYaml(2, 2, 2, 120, "cuda"));
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING) << Job(id).reason();
}

// What an agent's NVML read of its GPUs is listed with its node as of its last heartbeat,
// replaced by each one; a dead node lists none.
TEST_F(CoordinatorTest, EachNodesGpuReadingsAreListedAsItsLastHeartbeatSentThem) {
  ASSERT_TRUE(c_->Register(RegisterReq("g1", 2, "agent-1", v1::CUDA)).ok());
  v1::HeartbeatRequest hb;
  hb.set_name("g1");
  hb.set_agent_id("agent-1");
  v1::GpuTelemetry* g = hb.add_gpus();
  g->set_slot(1);
  g->set_utilization_pct(97);
  g->set_slowdown("thermal (hardware)");
  c_->Heartbeat(hb);
  v1::ListWorkersResponse workers = c_->ListWorkers();
  ASSERT_EQ(workers.workers(0).gpus_size(), 1);
  EXPECT_EQ(workers.workers(0).gpus(0).slot(), 1);
  EXPECT_EQ(workers.workers(0).gpus(0).utilization_pct(), 97);
  EXPECT_EQ(workers.workers(0).gpus(0).slowdown(), "thermal (hardware)");

  g->set_utilization_pct(12);
  g->clear_slowdown();
  c_->Heartbeat(hb);
  workers = c_->ListWorkers();
  ASSERT_EQ(workers.workers(0).gpus_size(), 1);
  EXPECT_EQ(workers.workers(0).gpus(0).utilization_pct(), 12);
  EXPECT_EQ(workers.workers(0).gpus(0).slowdown(), "");

  clock_.AdvanceMs(10'000);  // past the heartbeat timeout
  c_->Tick();
  workers = c_->ListWorkers();
  ASSERT_EQ(workers.workers(0).node().state(), v1::NODE_DEAD);
  EXPECT_EQ(workers.workers(0).gpus_size(), 0);
}

// A running job whose rank's GPU its hardware slows down has a notice naming the rank, the
// slot and why; it ends with the slowdown.
TEST_F(CoordinatorTest, ARankOnASlowedGpuIsANoticeOfItsJob) {
  ASSERT_TRUE(c_->Register(RegisterReq("g1", 2, "agent-1", v1::CUDA)).ok());
  const std::string id = Submit(SpecYaml(2, 2, 2, 120, "cuda"));
  c_->Tick();
  ASSERT_EQ(Beat("g1", {}).orders_size(), 2);
  Beat("g1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  int rank = -1;
  const v1::JobRecord job = Job(id);  // a copy: the loop below outlives Job()'s temporary
  for (const v1::RankAssignment& p : job.placement()) {
    if (p.slot() == 1) rank = p.rank();
  }
  ASSERT_GE(rank, 0);

  v1::HeartbeatRequest hb;
  hb.set_name("g1");
  hb.set_agent_id("agent-1");
  *hb.add_trainers() = Trainer(id, 1, 0);
  *hb.add_trainers() = Trainer(id, 1, 1);
  v1::GpuTelemetry* cool = hb.add_gpus();
  cool->set_slot(0);
  cool->set_temperature_c(60);
  v1::GpuTelemetry* hot = hb.add_gpus();
  hot->set_slot(1);
  hot->set_temperature_c(91);
  hot->set_slowdown("thermal (hardware)");
  c_->Heartbeat(hb);
  auto info = c_->GetJob(id);
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->notices_size(), 1);
  EXPECT_EQ(info->notices(0), "rank " + std::to_string(rank) +
                                  " on g1 slot 1: its GPU is slowed down (thermal (hardware), "
                                  "at 91 C)");

  hot->clear_slowdown();
  c_->Heartbeat(hb);
  info = c_->GetJob(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->notices_size(), 0);
}

TEST_F(CoordinatorTest, ARankItsStageWaitsForIsAStragglerNoticeOfItsJob) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 3)).ok());
  const std::string id = Submit(SpecYaml(3, 3));
  c_->Tick();
  ASSERT_EQ(Beat("n1", {}).orders_size(), 3);
  const auto paced = [&](int rank, double busy_ms) {
    v1::TrainerStatus t = Trainer(id, 1, rank, v1::TRAINER_RUNNING, 20);
    t.mutable_progress()->set_busy_ms(busy_ms);
    return t;
  };
  Beat("n1", {paced(0, 80), paced(1, 150), paced(2, 82)});
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  int slot = -1;
  const v1::JobRecord job = Job(id);
  for (const v1::RankAssignment& p : job.placement()) {
    if (p.rank() == 1) slot = p.slot();
  }
  ASSERT_GE(slot, 0);
  auto info = c_->GetJob(id);
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->notices_size(), 1);
  EXPECT_EQ(info->notices(0), "rank 1 on n1 slot " + std::to_string(slot) +
                                  " is a straggler: busy 150 ms a step, against 81 ms for the "
                                  "other 2 ranks of its stage (median): they wait for it at every "
                                  "step");
  EXPECT_EQ(std::vector<int>(info->straggler_ranks().begin(), info->straggler_ranks().end()),
            (std::vector<int>{1}));

  // Back in step with the others: no notice.
  Beat("n1", {paced(0, 80), paced(1, 84), paced(2, 82)});
  info = c_->GetJob(id);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->notices_size(), 0);
  EXPECT_EQ(info->straggler_ranks_size(), 0);
}

TEST_F(CoordinatorTest, AnOperatorPutsARepairedGpuBackInServiceAndTheJobGrowsOntoIt) {
  ASSERT_TRUE(c_->Register(RegisterReq("g1", 2, "agent-1", v1::CUDA)).ok());
  const std::string id = Submit(SpecYaml(1, 2, 2, 120, "cuda"));
  c_->Tick();
  ASSERT_EQ(Beat("g1", {}).orders_size(), 2);
  Beat("g1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  const int slot = Job(id).placement(1).slot();
  Beat("g1", {Exited(id, 1, 0, 0, 15), Exited(id, 1, 1, kExitDeviceFault)});
  c_->Tick();
  ASSERT_EQ(Job(id).placement_size(), 1);  // on the other GPU

  v1::UncordonRequest request;
  request.set_node("g1");
  request.set_slot_only(true);
  request.set_slot(slot);
  auto done = c_->Uncordon(request);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->was_cordoned());
  EXPECT_EQ(done->node().slot_faults_size(), 0);
  EXPECT_EQ(c_->ListWorkers().workers(0).free_slots(), 1);
  // The job, one rank below its largest size, is asked for a checkpoint to grow at.
  c_->Tick();
  const v1::HeartbeatResponse hb = Beat("g1", {Trainer(id, 2, 0, v1::TRAINER_RUNNING, 5)});
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_TRUE(hb.orders(0).has_checkpoint());
  // Durable: a restarted coordinator has it back in service too.
  Reopen();
  EXPECT_EQ(c_->ListWorkers().workers(0).node().slot_faults_size(), 0);
  // Unknown names are refused by name.
  request.set_node("g2");
  EXPECT_EQ(c_->Uncordon(request).status().code(), StatusCode::kNotFound);
}

// drover drain NODE --slot S: the slot is cordoned, and the job with a rank there moves it
// off at a checkpoint asked for now (not counted), to a free slot; the node's other slot
// keeps its rank. A job that saves no checkpoints moves at once; a drained slot with no
// rank on it moves nothing.
TEST_F(CoordinatorTest, AnOperatorsSlotDrainMovesTheRankOffAtACheckpointAndKeepsTheSlotOut) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string id = Submit(SpecYaml(2, 2));
  c_->Tick();
  ASSERT_EQ(Job(id).placement_size(), 2);
  ASSERT_EQ(Job(id).placement(0).node(), "n1");
  const int slot = Job(id).placement(1).slot();
  ASSERT_EQ(Beat("n1", {}).orders_size(), 2);
  Beat("n1",
       {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 7), Trainer(id, 1, 1, v1::TRAINER_RUNNING, 7)});
  ASSERT_TRUE(c_->Register(RegisterReq("n2", 1)).ok());  // the free slot it moves to

  v1::CordonRequest request;
  request.set_node("n1");
  request.set_slot_only(true);
  request.set_slot(slot);
  request.set_drain(true);
  request.set_requester("ops@h");
  request.set_reason("fan noise");
  auto drained = c_->Cordon(request);
  ASSERT_TRUE(drained.ok()) << drained.status();
  ASSERT_EQ(drained->jobs_size(), 1);
  EXPECT_EQ(drained->jobs(0), id);
  EXPECT_TRUE(drained->jobs_checkpoint(0));
  EXPECT_EQ(drained->node().slot_faults(0).operator_cordon(), "drained by ops@h: fan noise");
  EXPECT_FALSE(drained->node().drain()) << "the node is not drained, one slot is";
  const std::string moving =
      "moving rank 1 off n1 slot " + std::to_string(slot) + " (drained by ops@h: fan noise)";
  EXPECT_EQ(Job(id).reason(), moving + " at its next checkpoint");
  v1::HeartbeatResponse hb = Beat(
      "n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 8), Trainer(id, 1, 1, v1::TRAINER_RUNNING, 8)});
  bool asked = false;
  for (const auto& order : hb.orders()) asked |= order.has_checkpoint();
  EXPECT_TRUE(asked);

  // The checkpoint completes: the attempt ends there, and the next one runs on n1's other
  // slot and n2's, once the trainers have left.
  v1::HeartbeatRequest report;
  report.set_name("n1");
  report.set_agent_id("agent-1");
  *report.add_trainers() = Trainer(id, 1, 0, v1::TRAINER_RUNNING, 9);
  *report.add_trainers() = Trainer(id, 1, 1, v1::TRAINER_RUNNING, 9);
  v1::CheckpointRecord* ck = report.add_checkpoints();
  ck->set_job_id(id);
  ck->set_attempt(1);
  ck->set_step(9);
  ck->set_path("/runs/ck/step_9");
  c_->Heartbeat(report);
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  Beat("n1", {Exited(id, 1, 0, 0, 15), Exited(id, 1, 1, 0, 15)});
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
  EXPECT_EQ(Job(id).restarts(), 0);
  const v1::JobInfo info = *c_->GetJob(id);
  EXPECT_EQ(info.attempts(0).end_reason(), moving + " at the checkpoint of step 9");
  std::set<std::pair<std::string, int>> slots;
  for (const auto& r : info.job().placement()) slots.insert({r.node(), r.slot()});
  EXPECT_EQ(slots, (std::set<std::pair<std::string, int>>{{"n1", 1 - slot}, {"n2", 0}}));
  // Out by the operator's word alone: no straggler's cordon, no failure counted.
  const v1::ListWorkersResponse workers = c_->ListWorkers();
  for (const v1::WorkerInfo& w : workers.workers()) {
    if (w.node().name() != "n1") continue;
    ASSERT_EQ(w.node().slot_faults_size(), 1);
    EXPECT_EQ(w.node().slot_faults(0).failures(), 0);
    EXPECT_EQ(w.node().failures(), 0);
  }

  // Drained again on n2, with no free slot left and no smaller feasible size: it says it
  // will wait for one.
  request.set_node("n2");
  request.set_slot(0);
  drained = c_->Cordon(request);
  ASSERT_TRUE(drained.ok()) << drained.status();
  ASSERT_EQ(drained->jobs_size(), 1);
  EXPECT_NE(Job(id).reason().find(
                "at its next checkpoint, to wait for a free slot: none is free, and no smaller "
                "world size is feasible"),
            std::string::npos)
      << Job(id).reason();
}

TEST_F(CoordinatorTest, ASlotDrainMovesAJobWithoutCheckpointsAtOnceAndAnEmptySlotNothing) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 3)).ok());
  const std::string id = Submit(SpecYaml(1, 1) + "checkpoint: {every_steps: 0}\n");
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  const int slot = Job(id).placement(0).slot();
  Beat("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 4)});
  v1::CordonRequest request;
  request.set_node("n1");
  request.set_slot_only(true);
  request.set_drain(true);
  // A slot no rank runs on: cordoned, nothing moves.
  request.set_slot(slot == 2 ? 1 : 2);
  auto drained = c_->Cordon(request);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->jobs_size(), 0);
  EXPECT_EQ(Job(id).attempt(), 1);
  // The job's slot: it saves no checkpoints, so its attempt ends now, not counted.
  request.set_slot(slot);
  drained = c_->Cordon(request);
  ASSERT_TRUE(drained.ok()) << drained.status();
  ASSERT_EQ(drained->jobs_size(), 1);
  EXPECT_FALSE(drained->jobs_checkpoint(0));
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_EQ(Job(id).restarts(), 0);
  EXPECT_EQ(c_->GetJob(id)->attempts(0).end_reason(),
            "moving rank 0 off n1 slot " + std::to_string(slot) +
                " (drained by an operator) now (it saves no checkpoints: it starts again from "
                "step 0)");
  Beat("n1", {Exited(id, 1, 0, 0, 15)});
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  const int free = 3 - slot - (slot == 2 ? 1 : 2);  // the one slot neither drain took
  EXPECT_EQ(Job(id).placement(0).slot(), free);
}

// A tp2 job that may take 2 to 8 ranks, on two nodes of 3 slots: placed at 4 (a whole tp
// group on each node), saying why, and not grown into the one slot left on each (a third
// group would span them), whatever the passes; a node of 2 free slots joining makes it grow.
TEST_F(CoordinatorTest, AJobInTensorParallelGroupsRunsThemWholeAndGrowsOnlyIntoWholeOnes) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 3)).ok());
  ASSERT_TRUE(c_->Register(RegisterReq("n2", 3)).ok());
  const std::string id = Submit(SpecYaml(2, 8) + "parallel: {tp: 2}\n");
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  ASSERT_EQ(Job(id).placement_size(), 4);
  EXPECT_EQ(Job(id).placement(0).node(), Job(id).placement(1).node());
  EXPECT_EQ(Job(id).placement(2).node(), Job(id).placement(3).node());
  EXPECT_NE(Job(id).placement(0).node(), Job(id).placement(2).node());
  const std::string note =
      "placed at 4 ranks, not the 6 that fit: at 6, a block of 2 ranks (parallel.tp x dp_shard) "
      "would span nodes";
  EXPECT_EQ(Job(id).reason(), note);
  // Its ranks run and report; pass after pass, nothing plans a resize.
  auto listing = [&](const std::string& node, int64_t step) {
    std::vector<v1::TrainerStatus> trainers;
    const v1::JobRecord job = Job(id);
    for (const auto& r : job.placement()) {
      if (r.node() == node) trainers.push_back(Trainer(id, 1, r.rank(), v1::TRAINER_RUNNING, step));
    }
    return trainers;
  };
  for (int64_t step = 1; step <= 5; ++step) {
    for (const std::string node : {"n1", "n2"}) {
      const v1::HeartbeatResponse hb = Beat(node, listing(node, step));
      for (const auto& order : hb.orders()) EXPECT_FALSE(order.has_checkpoint()) << step;
    }
    clock_.AdvanceMs(500);
    c_->Tick();
  }
  EXPECT_EQ(Job(id).attempt(), 1);
  EXPECT_EQ(Job(id).reason(), note);
  // Two free slots on one node: a whole third group. It is asked for the checkpoint it grows
  // at.
  ASSERT_TRUE(c_->Register(RegisterReq("n3", 2)).ok());
  c_->Tick();
  EXPECT_EQ(Job(id).reason(), "growing to 6 ranks at its next checkpoint");
  bool asked = false;
  const v1::HeartbeatResponse hb = Beat("n1", listing("n1", 6));
  for (const auto& order : hb.orders()) asked |= order.has_checkpoint();
  EXPECT_TRUE(asked);
}

// drover drain: the node is out of service at once and durably; every heartbeat reply of its
// agent that lists a live trainer carries a drain order; the drained exit (75) restarts the
// job on another node, not counted; the node stays out, with nothing left to drain, until
// an operator's uncordon.
TEST_F(CoordinatorTest, AnOperatorsDrainMovesTheJobOffAndKeepsTheNodeOutUntilUncordoned) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  ASSERT_TRUE(c_->Register(RegisterReq("n2", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1) + "checkpoint: {dir: /tmp/ck, every_steps: 5}\n");
  c_->Tick();
  const std::string node = Job(id).placement(0).node();
  const std::string other = node == "n1" ? "n2" : "n1";
  ASSERT_EQ(Beat(node, {}).orders_size(), 1);
  Beat(node, {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 7)});

  v1::CordonRequest request;
  request.set_node(node);
  request.set_drain(true);
  request.set_reason("new NIC");
  request.set_requester("ops@h");
  auto drained = c_->Cordon(request);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->node().state(), v1::NODE_CORDONED);
  EXPECT_EQ(drained->node().operator_cordon(), "drained by ops@h: new NIC");
  ASSERT_EQ(drained->jobs_size(), 1);
  EXPECT_EQ(drained->jobs(0), id);
  EXPECT_TRUE(drained->jobs_checkpoint(0));

  v1::HeartbeatResponse hb = Beat(node, {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 8)});
  ASSERT_EQ(hb.orders_size(), 1);
  ASSERT_TRUE(hb.orders(0).has_drain());
  EXPECT_EQ(hb.orders(0).drain().reason(), "drained by ops@h: new NIC");
  EXPECT_EQ(hb.orders(0).drain().grace_ms(), 0) << "the agent's own --stop-grace-ms";
  v1::ListWorkersResponse workers = c_->ListWorkers();
  for (const v1::WorkerInfo& w : workers.workers()) {
    EXPECT_EQ(w.draining(), w.node().name() == node) << w.node().name();
    if (w.node().name() == node) {
      EXPECT_EQ(w.free_slots(), 0);
    }
  }

  Beat(node, {Exited(id, 1, 0, kExitDrained)});
  c_->Tick();
  const v1::JobRecord moved = Job(id);
  EXPECT_EQ(moved.attempt(), 2);
  EXPECT_EQ(moved.restarts(), 0) << "a drain is not the job's failure";
  ASSERT_EQ(moved.placement_size(), 1);
  EXPECT_EQ(moved.placement(0).node(), other);
  hb = Beat(node, {Exited(id, 1, 0, kExitDrained)});
  EXPECT_EQ(hb.orders_size(), 0) << "nothing live left to drain";
  workers = c_->ListWorkers();
  for (const v1::WorkerInfo& w : workers.workers()) EXPECT_FALSE(w.draining());

  // Durable: a restarted coordinator keeps the node out, whatever its agent says.
  Reopen();
  ASSERT_TRUE(c_->Register(RegisterReq(node, 1, "agent-2")).ok());
  Beat(node, {}, "agent-2");
  workers = c_->ListWorkers();
  for (const v1::WorkerInfo& w : workers.workers()) {
    if (w.node().name() != node) continue;
    EXPECT_EQ(w.node().state(), v1::NODE_CORDONED);
    EXPECT_TRUE(w.node().drain());
    EXPECT_EQ(w.free_slots(), 0);
  }

  v1::UncordonRequest back;
  back.set_node(node);
  auto done = c_->Uncordon(back);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->was_cordoned());
  EXPECT_EQ(done->node().state(), v1::NODE_ALIVE);
  EXPECT_TRUE(done->node().operator_cordon().empty());
  workers = c_->ListWorkers();
  for (const v1::WorkerInfo& w : workers.workers()) {
    if (w.node().name() == node) {
      EXPECT_EQ(w.free_slots(), 1);
    }
  }
  request.set_node("n9");
  EXPECT_EQ(c_->Cordon(request).status().code(), StatusCode::kNotFound);
  request.set_node(node);
  request.set_reason(std::string(2000, 'x'));
  EXPECT_EQ(c_->Cordon(request).status().code(), StatusCode::kInvalidArgument);
}

// drover submit --after: a job waits for the jobs it names to succeed, out of the queue, so
// that the jobs behind it are placed meanwhile; then it takes its place. After a job that
// ended otherwise it can never start, and says so until cancelled. The list is durable.
TEST_F(CoordinatorTest, AJobSubmittedAfterOthersStartsOnceTheySucceedWithoutHoldingBackTheQueue) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const auto submit_after = [&](const std::vector<std::string>& after) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(SpecYaml(1, 1));
    for (const std::string& id : after) req.add_after(id);
    return c_->SubmitJob(req);
  };
  const std::string first = Submit(SpecYaml(1, 1));
  const std::string doomed = Submit(SpecYaml(1, 1));
  auto then = submit_after({first, first});
  ASSERT_TRUE(then.ok()) << then.status();
  auto never = submit_after({first, doomed});
  ASSERT_TRUE(never.ok()) << never.status();
  const std::string other = Submit(SpecYaml(1, 1));
  EXPECT_EQ(Job(*then).after_size(), 1) << "named twice, kept once";

  // Refused, and nothing made: a job that does not exist, or too many.
  const size_t jobs_before = JobIds().size();
  auto missing = submit_after({first, "j-999999-0000"});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no job j-999999-0000 to run after"));
  EXPECT_EQ(submit_after(std::vector<std::string>(kMaxAfterJobs + 1, first)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(submit_after({std::string(10000, 'j')}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(JobIds().size(), jobs_before);

  c_->Tick();
  ASSERT_EQ(Job(first).state(), v1::RUNNING);
  ASSERT_TRUE(c_->CancelJob(doomed).ok());
  c_->Tick();  // the reasons are those of the last scheduling pass (one a second at least)
  EXPECT_EQ(Job(*then).reason(), "waiting for " + first + " (RUNNING) to succeed");
  EXPECT_EQ(Job(*never).reason(), "it runs after job " + doomed +
                                      " succeeds, and that job ended CANCELLED, so it can never "
                                      "start: drover cancel " +
                                      *never);
  Beat("n1", {Trainer(first, 1, 0, v1::TRAINER_RUNNING, 3)});
  Beat("n1", {Exited(first, 1, 0, 0)});
  c_->Tick();
  ASSERT_EQ(Job(first).state(), v1::SUCCEEDED);
  EXPECT_EQ(Job(*then).state(), v1::RUNNING) << Job(*then).reason();
  EXPECT_EQ(Job(other).state(), v1::PENDING) << "queued after it";

  // Behind a job that waits for another, the queue moves: `other` starts while `later` waits.
  Beat("n1", {Exited(*then, 1, 0, 0)});
  c_->Tick();
  ASSERT_EQ(Job(*then).state(), v1::SUCCEEDED);
  ASSERT_EQ(Job(other).state(), v1::RUNNING);
  auto later = submit_after({other});
  ASSERT_TRUE(later.ok()) << later.status();
  const std::string last = Submit(SpecYaml(1, 1));
  Beat("n1", {Exited(other, 1, 0, 0)});
  c_->Tick();
  EXPECT_EQ(Job(*later).state(), v1::RUNNING) << "its turn came before " << last;

  // Durable: a restarted coordinator still holds `never` back, saying why.
  Reopen();
  c_->Tick();
  EXPECT_EQ(Job(*never).state(), v1::PENDING);
  ASSERT_EQ(Job(*never).after_size(), 2);
  EXPECT_THAT(Job(*never).reason(), HasSubstr("can never start"));
  ASSERT_TRUE(c_->CancelJob(*never).ok());
}

// drover drain --grace: the drain order gives the node's trainers that long to leave, also
// from a restarted coordinator; a later drain's grace replaces it, and the uncordon ends it.
// A grace that is out of range, or given to a cordon or to a slot's drain, is refused and
// changes nothing.
TEST_F(CoordinatorTest, AnOperatorsDrainWithAGraceOrdersItUntilTheUncordon) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string id = Submit(SpecYaml(1, 1) + "checkpoint: {dir: /tmp/ck, every_steps: 5}\n");
  c_->Tick();
  ASSERT_EQ(Beat("n1", {}).orders_size(), 1);
  const auto running = [&](int64_t step) {
    return std::vector<v1::TrainerStatus>{Trainer(id, 1, 0, v1::TRAINER_RUNNING, step)};
  };
  Beat("n1", running(7));

  v1::CordonRequest refused;
  refused.set_node("n1");
  refused.set_grace_ms(60000);
  auto st = c_->Cordon(refused).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("a drain only"));
  refused.set_drain(true);
  refused.set_slot_only(true);
  refused.set_slot(0);
  st = c_->Cordon(refused).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("a whole node's drain only"));
  refused.set_slot_only(false);
  for (int32_t grace : {-1, 24 * 3600 * 1000 + 1}) {
    refused.set_grace_ms(grace);
    st = c_->Cordon(refused).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << grace;
    EXPECT_THAT(st.message(), HasSubstr("out of range (0 to a day)"));
  }
  v1::HeartbeatResponse hb = Beat("n1", running(8));
  EXPECT_EQ(hb.orders_size(), 0) << "a refused drain drains nothing";
  EXPECT_TRUE(c_->ListWorkers().workers(0).node().operator_cordon().empty());

  v1::CordonRequest request;
  request.set_node("n1");
  request.set_drain(true);
  request.set_grace_ms(600000);
  auto drained = c_->Cordon(request);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->node().drain_grace_ms(), 600000);
  hb = Beat("n1", running(9));
  ASSERT_EQ(hb.orders_size(), 1);
  ASSERT_TRUE(hb.orders(0).has_drain());
  EXPECT_EQ(hb.orders(0).drain().grace_ms(), 600000);

  // Durable, as the drain is: the restarted coordinator orders the same grace.
  Reopen();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2, "agent-2")).ok());
  hb = Beat("n1", running(10), "agent-2");
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).drain().grace_ms(), 600000);

  // A cordon leaves the drain's grace as it is; a second drain's replaces it (none: the
  // agent's own).
  request.set_drain(false);
  request.set_grace_ms(0);
  ASSERT_TRUE(c_->Cordon(request).ok());
  hb = Beat("n1", running(11), "agent-2");
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).drain().grace_ms(), 600000);
  request.set_drain(true);
  ASSERT_TRUE(c_->Cordon(request).ok());
  hb = Beat("n1", running(12), "agent-2");
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).drain().grace_ms(), 0);

  request.set_grace_ms(90000);
  ASSERT_TRUE(c_->Cordon(request).ok());
  v1::UncordonRequest back;
  back.set_node("n1");
  auto done = c_->Uncordon(back);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->node().drain());
  EXPECT_EQ(done->node().drain_grace_ms(), 0) << "the grace ends with the drain";
}

// drover cordon: nothing new is placed on the node, and what runs there runs on (no drain
// order); a job waiting for slots starts on the node only after its uncordon.
TEST_F(CoordinatorTest, AnOperatorsCordonPlacesNothingNewAndStopsNothing) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string first = Submit(SpecYaml(1, 1));
  c_->Tick();
  ASSERT_EQ(Beat("n1", {}).orders_size(), 1);
  v1::CordonRequest request;
  request.set_node("n1");
  auto cordoned = c_->Cordon(request);
  ASSERT_TRUE(cordoned.ok()) << cordoned.status();
  EXPECT_EQ(cordoned->node().operator_cordon(), "cordoned by an operator");
  EXPECT_EQ(cordoned->jobs_size(), 0) << "a cordon moves nothing";
  EXPECT_EQ(Beat("n1", {Trainer(first, 1, 0)}).orders_size(), 0);
  const std::string second = Submit(SpecYaml(1, 1));
  c_->Tick();
  EXPECT_EQ(Job(second).state(), v1::PENDING);
  EXPECT_EQ(Job(first).state(), v1::RUNNING);
  v1::UncordonRequest back;
  back.set_node("n1");
  ASSERT_TRUE(c_->Uncordon(back).ok());
  c_->Tick();
  EXPECT_EQ(Job(second).state(), v1::RUNNING);
}

TEST_F(CoordinatorTest, AnOperatorsCordonOfOneSlotKeepsTheNodesOtherSlotsInUse) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  v1::CordonRequest request;
  request.set_node("n1");
  request.set_slot_only(true);
  request.set_slot(0);
  request.set_requester("ops@h");
  request.set_reason("fan noise");
  auto cordoned = c_->Cordon(request);
  ASSERT_TRUE(cordoned.ok()) << cordoned.status();
  EXPECT_EQ(cordoned->node().operator_cordon(), "") << "the node stays in service";
  ASSERT_EQ(cordoned->node().slot_faults_size(), 1);
  EXPECT_EQ(cordoned->node().slot_faults(0).operator_cordon(), "cordoned by ops@h: fan noise");
  // A one-rank job goes onto slot 1; a second waits, though the node has two slots.
  const std::string first = Submit(SpecYaml(1, 1));
  c_->Tick();
  ASSERT_EQ(Job(first).state(), v1::RUNNING);
  EXPECT_EQ(Job(first).placement(0).slot(), 1);
  const std::string second = Submit(SpecYaml(1, 1));
  c_->Tick();
  EXPECT_EQ(Job(second).state(), v1::PENDING);
  // Its uncordon puts it back.
  v1::UncordonRequest back;
  back.set_node("n1");
  back.set_slot_only(true);
  back.set_slot(0);
  auto uncordoned = c_->Uncordon(back);
  ASSERT_TRUE(uncordoned.ok()) << uncordoned.status();
  EXPECT_TRUE(uncordoned->was_cordoned());
  c_->Tick();
  EXPECT_EQ(Job(second).state(), v1::RUNNING);
  EXPECT_EQ(Job(second).placement(0).slot(), 0);
  // A slot the node lacks is named.
  request.set_slot(7);
  auto refused = c_->Cordon(request);
  EXPECT_EQ(refused.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(refused.status().message(), "node n1 has no slot 7 (it has 2)");
}

TEST_F(CoordinatorTest, HangDetectedFromStalledHeartbeats) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1, 2, /*hang_s=*/5));
  c_->Tick();
  for (int i = 0; i < 6; ++i) {
    Beat("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 3)});
    c_->Tick();
    clock_.AdvanceMs(1000);
  }
  Beat("n1", {Trainer(id, 1, 0, v1::TRAINER_RUNNING, 3)});
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_NE(Job(id).reason().find("hung"), std::string::npos);
}

TEST_F(CoordinatorTest, JobThatCanNeverFitSaysWhy) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string id = Submit(SpecYaml(4, 4));
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::PENDING);
  EXPECT_NE(Job(id).reason().find("needs at least 4 cpu slots"), std::string::npos);
  ASSERT_TRUE(c_->Register(RegisterReq("n2", 2)).ok());  // a node joins: now it fits
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
}

TEST_F(CoordinatorTest, CrashingJobMovesToAnotherNodeThenWaitsOutAGrowingDelay) {
  options_.restart_backoff.base_ms = 300;  // off the 1 s fallback pass: the delay's own
  Reopen();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  ASSERT_TRUE(c_->Register(RegisterReq("n2", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1, /*max_restarts=*/10));
  c_->Tick();
  ASSERT_EQ(Job(id).placement(0).node(), "n1");
  auto crash = [&](const std::string& node, int64_t attempt) {
    v1::TrainerExitRequest exit;
    exit.set_name(node);
    exit.set_agent_id("agent-1");
    *exit.mutable_trainer() = Exited(id, attempt, 0, 1);
    ASSERT_TRUE(c_->ReportTrainerExit(exit).ok());
  };
  // First failure: restarted at the next tick, on the other node.
  crash("n1", 1);
  c_->Tick();
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
  EXPECT_EQ(Job(id).placement(0).node(), "n2");
  // Second failure in a row: it waits 300 ms, and says so; then both nodes failed it and
  // it fits nowhere else, so it goes back to one of them.
  crash("n2", 2);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_NE(Job(id).reason().find("restarting in 1 s after 2 failures in a row"), std::string::npos)
      << Job(id).reason();
  clock_.AdvanceMs(299);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  clock_.AdvanceMs(1);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 3);
  EXPECT_EQ(Job(id).restart_not_before_ms(), 0);
}

TEST_F(CoordinatorTest, RestartRestoresJobsAttemptsNodesWithoutKillingAnything) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  const std::string id = Submit(SpecYaml(2, 2));
  const std::string queued = Submit(SpecYaml(2, 2));
  c_->Tick();
  Beat("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  ASSERT_TRUE(c_->Flush().ok());
  Reopen();

  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 1);
  EXPECT_EQ(Job(queued).state(), v1::PENDING);
  EXPECT_EQ(c_->ListJobs().jobs_size(), 2);
  // Rendezvous for the running attempt is served again.
  EXPECT_TRUE(c_->rendezvous().Set(id, 1, "k", "v").ok());
  // The node is known (no re-registration needed) but waits for its agent to reconnect.
  clock_.AdvanceMs(2500);
  c_->Tick();
  auto resp = Beat("n1", {Trainer(id, 1, 0), Trainer(id, 1, 1)});
  EXPECT_FALSE(resp.reregister());
  EXPECT_EQ(resp.orders_size(), 0);
  clock_.AdvanceMs(2500);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(queued).state(), v1::PENDING);
  // New job ids keep counting after the restart.
  EXPECT_NE(Submit(SpecYaml(1, 1)), queued);
}

TEST_F(CoordinatorTest, RestoredNodeThatNeverReturnsIsDeadAfterGrace) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1));
  c_->Tick();
  Beat("n1", {Trainer(id, 1, 0)});
  ASSERT_TRUE(c_->Flush().ok());
  clock_.AdvanceMs(60'000);  // the coordinator was down a long time
  Reopen();
  clock_.AdvanceMs(2999);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  clock_.AdvanceMs(1);
  c_->Tick();
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
}

// A placement is a transition the coordinator makes in memory and writes behind; its start
// orders wait until it is on disk, so that a crash in between never leaves trainers of an
// attempt the restarted coordinator does not know. Once it is durable, the agents are
// nudged to come for them.
TEST_F(CoordinatorTest, StartOrdersLeaveOnlyOnceTheAttemptIsDurable) {
  ReopenWithFaults();
  std::vector<std::string> nudged;
  std::mutex nudged_mu;
  c_->SetNudge([&](const std::string& node) {
    std::lock_guard<std::mutex> lock(nudged_mu);
    nudged.push_back(node);
  });
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1));
  ASSERT_TRUE(c_->Flush().ok());
  store_->Pause();
  c_->Tick();  // places attempt 1; its record waits behind the paused store
  ASSERT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(BeatNow("n1", {}).orders_size(), 0);
  {
    std::lock_guard<std::mutex> lock(nudged_mu);
    EXPECT_TRUE(nudged.empty());
  }
  store_->Resume();
  ASSERT_TRUE(c_->Flush().ok());
  {
    std::lock_guard<std::mutex> lock(nudged_mu);
    EXPECT_EQ(nudged, std::vector<std::string>{"n1"});
  }
  v1::HeartbeatResponse hb = Beat("n1", {});
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).start().attempt(), 1);
  c_->SetNudge(nullptr);
}

TEST_F(CoordinatorTest, SubmitTheStoreCannotWriteIsRefusedAndTheJobNeverExists) {
  ReopenWithFaults();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string a = Submit(SpecYaml(1, 1));
  c_->Tick();
  ASSERT_EQ(Job(a).state(), v1::RUNNING);
  ASSERT_TRUE(c_->Flush().ok());

  store_->FailAllWrites(DiskFull());
  v1::SubmitJobRequest req;
  req.set_spec_yaml(SpecYaml(1, 1));
  auto refused = c_->SubmitJob(req);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("job not submitted"));
  EXPECT_THAT(refused.status().message(), HasSubstr(options_.state_dir + "/state.db"));
  EXPECT_THAT(refused.status().message(), HasSubstr("database or disk is full"));
  // Not listed, never scheduled; and a refusal is not a reason to stop.
  EXPECT_EQ(JobIds(), std::vector<std::string>{a});
  c_->Tick();
  EXPECT_EQ(JobIds(), std::vector<std::string>{a});
  EXPECT_TRUE(Fatal().empty());

  // Room again: submits are accepted, and what memory lists is what a restart finds.
  store_->HealWrites();
  const std::string b = Submit(SpecYaml(1, 1));
  EXPECT_EQ(JobIds(), (std::vector<std::string>{a, b}));
  ASSERT_TRUE(c_->Flush().ok());
  Reopen();
  EXPECT_EQ(JobIds(), (std::vector<std::string>{a, b}));
}

TEST_F(CoordinatorTest, CancelTheStoreCannotWriteIsRefusedAndTheJobRunsOn) {
  ReopenWithFaults();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1));
  c_->Tick();
  Beat("n1", {Trainer(id, 1, 0)});
  ASSERT_TRUE(c_->Flush().ok());
  store_->FailAllWrites(DiskFull());
  auto refused = c_->CancelJob(id);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("not cancelled"));
  EXPECT_THAT(refused.status().message(), HasSubstr("database or disk is full"));
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Beat("n1", {Trainer(id, 1, 0)}).orders_size(), 0);  // no stop order went out
  EXPECT_TRUE(Fatal().empty());
  store_->HealWrites();
  ASSERT_TRUE(c_->CancelJob(id).ok());
  EXPECT_EQ(Job(id).state(), v1::CANCELLED);
  ASSERT_TRUE(c_->Flush().ok());
  Reopen();
  EXPECT_EQ(Job(id).state(), v1::CANCELLED);
}

TEST_F(CoordinatorTest, UncordonTheStoreCannotWriteIsRefusedAndTheCordonStays) {
  ReopenWithFaults();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  v1::TrainerExitRequest cut;  // a peer check that names n1: cordoned at once
  const std::string id = Submit(SpecYaml(1, 1));
  c_->Tick();
  Beat("n1", {Trainer(id, 1, 0)});
  cut.set_name("n1");
  cut.set_agent_id("agent-1");
  *cut.mutable_trainer() = Exited(id, 1, 0, 1);
  cut.mutable_trainer()->mutable_progress()->add_cut_off_ranks(0);
  ASSERT_TRUE(c_->ReportTrainerExit(cut).ok());
  ASSERT_TRUE(c_->Flush().ok());
  ASSERT_EQ(c_->ListWorkers().workers(0).node().state(), v1::NODE_CORDONED);
  store_->FailAllWrites(DiskFull());
  v1::UncordonRequest request;
  request.set_node("n1");
  auto refused = c_->Uncordon(request);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("node n1 not uncordoned"));
  EXPECT_THAT(refused.status().message(), HasSubstr("database or disk is full"));
  EXPECT_EQ(c_->ListWorkers().workers(0).node().state(), v1::NODE_CORDONED);
  EXPECT_TRUE(Fatal().empty());
  store_->HealWrites();
  auto done = c_->Uncordon(request);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->was_cordoned());
  EXPECT_EQ(done->node().state(), v1::NODE_ALIVE);
  EXPECT_EQ(done->node().failures(), 0);
}

TEST_F(CoordinatorTest, HeartbeatDrivenChangeThatCannotBeWrittenStopsTheCoordinator) {
  ReopenWithFaults();
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  const std::string id = Submit(SpecYaml(1, 1));
  c_->Tick();
  Beat("n1", {Trainer(id, 1, 0)});
  ASSERT_TRUE(c_->Flush().ok());

  // The trainer exits: the job must recover, whatever the disk says. Memory has moved on,
  // the write fails, so the coordinator must stop rather than run ahead of its disk.
  store_->FailAllWrites(DiskFull());
  Beat("n1", {Exited(id, 1, 0, 1)});
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  Status flushed = c_->Flush();
  EXPECT_EQ(flushed.code(), StatusCode::kResourceExhausted);
  ASSERT_EQ(Fatal().size(), 1u);
  EXPECT_THAT(Fatal()[0].message(), HasSubstr("database or disk is full"));
  // Nothing is written after it, even with room again: a later change would build on the
  // lost one. (In production the fatal hook has exited the process by now.)
  store_->HealWrites();
  c_->Tick();  // places attempt 2 in memory
  EXPECT_FALSE(c_->Flush().ok());
  EXPECT_EQ(Fatal().size(), 1u);

  // The restart resumes from disk, which is consistent: attempt 1 still running there, and
  // the agent's listing of the exited trainer makes the same transition again.
  Reopen();
  EXPECT_EQ(Job(id).state(), v1::RUNNING);
  EXPECT_EQ(Job(id).attempt(), 1);
  Beat("n1", {Exited(id, 1, 0, 1)});
  EXPECT_EQ(Job(id).state(), v1::RECOVERING);
  EXPECT_TRUE(c_->Flush().ok());
}

// A coordinator on a fake clock behind a real gRPC server listening on `listen`.
class CoordinatorServerTest : public ::testing::Test {
 protected:
  void Serve(const std::string& listen) {
    CoordinatorOptions options;
    options.state_dir = ::testing::TempDir() + "/drover_coord_server_" + std::to_string(getpid()) +
                        "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(options.state_dir);
    auto c = Coordinator::Open(options, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
    auto server = CoordinatorServer::Start(c_.get(), listen, 10);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  FakeClock clock_;
  std::unique_ptr<Coordinator> c_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(CoordinatorServerTest, ServesRpcsOnLoopback) {
  ASSERT_NO_FATAL_FAILURE(Serve("127.0.0.1:0"));
  ASSERT_GT(server_->port(), 0);
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  auto workers = v1::WorkerService::NewStub(channel);
  auto kv = v1::RendezvousService::NewStub(channel);

  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_spec_yaml("name: x\ntrain: {bogus_key: 1}\n");
    v1::SubmitJobResponse resp;
    grpc::Status st = jobs->SubmitJob(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("bogus_key"), std::string::npos);
  }
  std::string id;
  {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_spec_yaml(SpecYaml(1, 1));
    v1::SubmitJobResponse resp;
    ASSERT_TRUE(jobs->SubmitJob(&ctx, req, &resp).ok());
    id = resp.job_id();
  }
  {
    grpc::ClientContext ctx;
    v1::RegisterResponse resp;
    ASSERT_TRUE(workers->Register(&ctx, RegisterReq("n1", 1), &resp).ok());
    EXPECT_EQ(resp.heartbeat_timeout_ms(), 3000);
  }
  // The ticker places the job; the heartbeat reply carries the start order.
  v1::HeartbeatResponse hb;
  for (int i = 0; i < 200 && hb.orders_size() == 0; ++i) {
    grpc::ClientContext ctx;
    v1::HeartbeatRequest req;
    req.set_name("n1");
    req.set_agent_id("agent-1");
    ASSERT_TRUE(workers->Heartbeat(&ctx, req, &hb).ok());
    if (hb.orders_size() == 0) usleep(5000);
  }
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).start().job_id(), id);
  EXPECT_EQ(hb.orders(0).start().coordinator_address(), server_->address());
  {
    grpc::ClientContext ctx;
    v1::KvSetRequest req;
    req.mutable_key()->set_job_id(id);
    req.mutable_key()->set_attempt(1);
    req.mutable_key()->set_key("addr");
    req.set_value("x");
    v1::KvSetResponse resp;
    ASSERT_TRUE(kv->Set(&ctx, req, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::KvWaitRequest req;
    req.set_job_id(id);
    req.set_attempt(0);
    req.add_keys("addr");
    v1::KvWaitResponse resp;
    EXPECT_EQ(kv->Wait(&ctx, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
}

TEST_F(CoordinatorServerTest, WildcardListenAdvertisesNoRendezvousAddress) {
  // 0.0.0.0 is not an address another node can dial: start orders leave it empty and each
  // agent substitutes the address it reaches the coordinator by.
  ASSERT_NO_FATAL_FAILURE(Serve("0.0.0.0:0"));
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(SpecYaml(1, 1));
  ASSERT_TRUE(c_->SubmitJob(submit).ok());
  c_->Tick();
  ASSERT_TRUE(c_->Flush().ok());  // start orders wait for their attempt to be durable
  v1::HeartbeatRequest req;
  req.set_name("n1");
  req.set_agent_id("agent-1");
  v1::HeartbeatResponse hb = c_->Heartbeat(req);
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).start().coordinator_address(), "");
  // --advertise names one explicitly.
  c_->SetAdvertisedAddress("10.1.2.3:7600");
  hb = c_->Heartbeat(req);
  ASSERT_EQ(hb.orders_size(), 1);
  EXPECT_EQ(hb.orders(0).start().coordinator_address(), "10.1.2.3:7600");
}

TEST_F(CoordinatorServerTest, ShutsDownWhileHeartbeatsArrive) {
  // Heartbeats in flight while the server stops: every call ends (answered or cancelled),
  // no call is left behind (the ASan build checks for leaks) and nothing aborts.
  ASSERT_NO_FATAL_FAILURE(Serve("127.0.0.1:0"));
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 1)).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&] {
      auto stub = v1::WorkerService::NewStub(
          grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
      while (!stop) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        v1::HeartbeatRequest req;
        req.set_name("n1");
        req.set_agent_id("agent-1");
        v1::HeartbeatResponse resp;
        if (stub->Heartbeat(&ctx, req, &resp).ok()) ++answered;
      }
    });
  }
  while (answered < 200) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->Shutdown();
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_GE(answered, 200);
}

}  // namespace
}  // namespace drover::coordinator
