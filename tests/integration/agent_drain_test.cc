// A node shut down on purpose (its agent gets SIGTERM: systemctl stop, a Kubernetes eviction,
// a spot instance's notice) while a real two-rank job runs on it, with no periodic
// checkpoint due for a million steps. The agent drains its trainer: the job's ranks agree on
// a step, save its checkpoint, and the drained rank exits once rank 0 has committed it. The
// job restarts on the other node from that checkpoint, the restart not counted, and the agent
// exits 0 within its grace period. Before, the trainers were stopped outright and the job
// started again from scratch. And the same stop at a checkpoint asked for a whole job:
// drover suspend, its slots given back, and drover resume; and a job's time limit
// (drover submit --time-limit), at which it ends FAILED at a checkpoint that a job
// submitted again goes on from.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "common/job_state.h"
#include "tests/integration/cluster.h"
#include "tests/integration/train_process.h"

namespace drover {
namespace {

class AgentDrainTest : public TrainProcessFixture {
 protected:
  // A two-rank job with no periodic checkpoint due for a million steps.
  std::string JobYaml(const std::string& name) const {
    return "name: " + name + "\noutput_dir: " + (dir_ / name).string() +
           "\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
           "data: {train: " +
           (dir_ / "train.bin").string() +
           "}\ntrain: {steps: 1000000, global_batch: 4, micro_batch: 2, seq_len: 16, lr: 0.003, "
           "warmup_steps: 5, schedule: constant, eval_every: 0}\n"
           "checkpoint: {every_steps: 1000000, keep_last: 3}\n"
           "resources: {world_size: {min: 2, max: 2}, threads_per_rank: 1}\n"
           "fault_tolerance: {max_restarts: 0}\n";
  }
  // Starts a cluster of three agents (cluster_) with `agent_stop_grace_ms` and the job (id_)
  // on two of them, and waits until it has trained 20 steps.
  void StartJob(const std::string& name, v1::JobInfo* running, int agent_stop_grace_ms = 30000) {
    testing::ClusterOptions o;
    o.agents = 3;
    o.trainer = "drover-trainer";
    o.name = name;
    o.agent_stop_grace_ms = agent_stop_grace_ms;
    cluster_ = std::make_unique<testing::Cluster>(o);
    ASSERT_TRUE(cluster_->Start()) << cluster_->DebugLogs();
    auto id = cluster_->Submit(JobYaml(name));
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
    ASSERT_TRUE(cluster_->WaitJob(
        id_,
        [](const v1::JobInfo& i) {
          return i.job().state() == v1::FAILED ||
                 (i.job().state() == v1::RUNNING && i.job().last_step() >= 20);
        },
        60000, running))
        << running->job().reason() << cluster_->DebugLogs();
    ASSERT_EQ(running->job().state(), v1::RUNNING) << running->job().reason();
  }
  // Waits until the job runs attempt 2 past the step it resumed from.
  static v1::JobInfo WaitSecondAttempt(testing::Cluster& cluster, const std::string& id) {
    v1::JobInfo after;
    EXPECT_TRUE(cluster.WaitJob(
        id,
        [](const v1::JobInfo& i) {
          return i.job().state() == v1::FAILED ||
                 (i.job().state() == v1::RUNNING && i.job().attempt() >= 2 &&
                  i.attempts_size() >= 2 && i.job().last_step() > i.attempts(1).resume_step());
        },
        60000, &after))
        << after.job().reason() << cluster.DebugLogs();
    return after;
  }

  // The drover CLI against cluster_.
  testing::CliResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--coordinator", cluster_->address()});
    return testing::RunCli(cluster_->root(), std::move(args));
  }

  std::unique_ptr<testing::Cluster> cluster_;
  std::string id_;
};

TEST_F(AgentDrainTest, AStoppedAgentDrainsItsTrainerAndTheJobResumesFromThatCheckpoint) {
  v1::JobInfo running;
  ASSERT_NO_FATAL_FAILURE(StartJob("drain", &running));
  testing::Cluster& cluster = *cluster_;
  ASSERT_LT(running.job().latest_checkpoint_step(), 1) << "no checkpoint was due";
  const int64_t stopped_at = running.job().last_step();
  const std::string node = running.attempts(0).placement(1).node();

  testing::Process* agent = cluster.agent(node);
  ASSERT_NE(agent, nullptr) << node;
  agent->Kill(SIGTERM);
  int wait_status = 0;
  ASSERT_TRUE(agent->Wait(30000, &wait_status)) << "the agent outlived its grace period";
  EXPECT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;

  v1::JobInfo after = WaitSecondAttempt(cluster, id_);
  ASSERT_EQ(after.job().state(), v1::RUNNING) << after.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(after.job().restarts(), 0) << "a drain is no failure of the job's";
  // Whichever rank's exit the coordinator heard of first: the drained one's, or its peer's,
  // whose collective failed as the drained rank left.
  const std::string& why = after.attempts(0).end_reason();
  EXPECT_NE(why.find("drained: a node is taken out of service"), std::string::npos) << why;
  EXPECT_NE(why.find("drained after checkpoint step"), std::string::npos) << why;
  // The checkpoint was saved at the step the ranks agreed on after the drain began.
  EXPECT_GE(after.attempts(1).resume_step(), stopped_at) << after.attempts(1).resume_checkpoint();
  for (const auto& r : after.attempts(1).placement()) EXPECT_NE(r.node(), node);
  // The node left on purpose: dead once its agent is gone, with no failure counted.
  v1::NodeRecord left;
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        auto workers = cluster.ListWorkers();
        if (!workers.ok()) return false;
        for (const auto& w : workers->workers()) {
          if (w.node().name() == node) left = w.node();
        }
        return left.state() == v1::NODE_DEAD;
      },
      10000))
      << left.DebugString();
  EXPECT_EQ(left.failures(), 0) << left.DebugString();
  std::printf("drained at step %lld or after; attempt 2 resumed from step %lld\n",
              static_cast<long long>(stopped_at),
              static_cast<long long>(after.attempts(1).resume_step()));
  ASSERT_TRUE(cluster.Cancel(id_).ok());
  ASSERT_TRUE(cluster.WaitJob(
      id_, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 60000, &after));
}

// An operator drains a node by hand (drover drain NODE --wait), its agent running on: the
// job's ranks save the checkpoint of a step agreed after the drain began, the job resumes on
// the other nodes from it, not counted, and the node stays out of service (drover workers
// says by whom and why) with its agent alive, until drover uncordon.
// The agents' own grace is 1 ms, too short to save anything: the checkpoint the job resumes
// from is there because drover drain --grace gave the trainer 30 s.
TEST_F(AgentDrainTest, DroverDrainMovesTheJobOffWithItsCheckpointAndKeepsTheNodeOut) {
  v1::JobInfo running;
  ASSERT_NO_FATAL_FAILURE(StartJob("operator-drain", &running, /*agent_stop_grace_ms=*/1));
  testing::Cluster& cluster = *cluster_;
  const int64_t drained_at = running.job().last_step();
  const std::string node = running.attempts(0).placement(1).node();

  testing::CliResult refused = Cli({"drain", node, "--grace", "30s", "--slot", "0"});
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("a grace applies to a whole node's drain only"), std::string::npos)
      << refused.out;
  refused = Cli({"drain", node, "--grace", "30 parsecs"});
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("--grace"), std::string::npos) << refused.out;
  testing::CliResult drain =
      Cli({"drain", node, "--reason", "new NIC", "--grace", "30s", "--wait", "--timeout", "15"});
  ASSERT_EQ(drain.code, 0) << drain.out << cluster.DebugLogs();
  EXPECT_NE(drain.out.find("leave, each killed if still running 30.0s after its signal"),
            std::string::npos)
      << drain.out;
  EXPECT_NE(drain.out.find(id_ + ": restarts elsewhere from the checkpoint"), std::string::npos)
      << drain.out;
  EXPECT_NE(drain.out.find(node + " is drained: no trainer runs there"), std::string::npos)
      << drain.out;

  v1::JobInfo after = WaitSecondAttempt(cluster, id_);
  ASSERT_EQ(after.job().state(), v1::RUNNING) << after.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(after.job().restarts(), 0) << "a drain is no failure of the job's";
  const std::string& why = after.attempts(0).end_reason();
  EXPECT_NE(why.find("drained: a node is taken out of service"), std::string::npos) << why;
  EXPECT_GE(after.attempts(1).resume_step(), drained_at) << after.attempts(1).resume_checkpoint();
  for (const auto& r : after.attempts(1).placement()) EXPECT_NE(r.node(), node);

  testing::CliResult workers = Cli({"workers"});
  ASSERT_EQ(workers.code, 0) << workers.out;
  EXPECT_NE(workers.out.find(node + ": drained by "), std::string::npos) << workers.out;
  EXPECT_NE(workers.out.find(": new NIC (trainers given 30.0s to leave), "), std::string::npos)
      << workers.out;
  EXPECT_NE(workers.out.find("CORDONED"), std::string::npos) << workers.out;
  EXPECT_TRUE(cluster.agent(node)->running()) << "the agent itself runs on";

  testing::CliResult back = Cli({"uncordon", node});
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_NE(back.out.find(node + " is back in service"), std::string::npos) << back.out;
  auto listed = cluster.ListWorkers();
  ASSERT_TRUE(listed.ok());
  for (const auto& w : listed->workers()) {
    if (w.node().name() != node) continue;
    EXPECT_EQ(w.node().state(), v1::NODE_ALIVE) << w.node().DebugString();
    EXPECT_EQ(w.node().failures(), 0) << w.node().DebugString();
    EXPECT_EQ(w.free_slots(), 1) << w.node().DebugString();
  }
  // Its one slot alone, by the CLI: out of use until that slot's uncordon, the node ALIVE.
  testing::CliResult slot = Cli({"cordon", node, "--slot", "0", "--reason", "fan noise"});
  ASSERT_EQ(slot.code, 0) << slot.out;
  EXPECT_NE(slot.out.find(node +
                          " slot 0 is cordoned: nothing new is placed on it until drover "
                          "uncordon " +
                          node + " --slot 0"),
            std::string::npos)
      << slot.out;
  workers = Cli({"workers"});
  EXPECT_NE(workers.out.find(node + " slot 0: cordoned by "), std::string::npos) << workers.out;
  EXPECT_NE(workers.out.find(": fan noise, "), std::string::npos) << workers.out;
  EXPECT_EQ(workers.out.find("CORDONED"), std::string::npos) << workers.out;
  listed = cluster.ListWorkers();
  ASSERT_TRUE(listed.ok());
  for (const auto& w : listed->workers()) {
    if (w.node().name() == node) {
      EXPECT_EQ(w.free_slots(), 0) << w.node().DebugString();
    }
  }
  testing::CliResult missing = Cli({"cordon", node, "--slot", "5"});
  EXPECT_EQ(missing.code, 1) << missing.out;  // NOT_FOUND from the coordinator
  EXPECT_NE(missing.out.find("node " + node + " has no slot 5 (it has 1)"), std::string::npos)
      << missing.out;
  // Its drain moves nothing: no rank runs there.
  testing::CliResult slot_drain = Cli({"drain", node, "--slot", "0", "--wait"});
  ASSERT_EQ(slot_drain.code, 0) << slot_drain.out;
  EXPECT_NE(slot_drain.out.find(node + " slot 0 is cordoned until drover uncordon " + node +
                                " --slot 0; no job runs there"),
            std::string::npos)
      << slot_drain.out;
  back = Cli({"uncordon", node, "--slot", "0"});
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_NE(back.out.find(node + " slot 0 is back in service"), std::string::npos) << back.out;

  std::printf("drained at step %lld or after; attempt 2 resumed from step %lld\n",
              static_cast<long long>(drained_at),
              static_cast<long long>(after.attempts(1).resume_step()));
  ASSERT_TRUE(cluster.Cancel(id_).ok());
  ASSERT_TRUE(cluster.WaitJob(
      id_, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 60000, &after));
}

// An operator drains one slot (drover drain NODE --slot 0 --wait): the rank there moves off
// at a checkpoint its job's ranks save now, the job resumes from it on a free slot, not
// counted, and the node itself stays in service.
TEST_F(AgentDrainTest, DroverDrainOfASlotMovesItsRankOffAtACheckpointAndLeavesTheNodeIn) {
  v1::JobInfo running;
  ASSERT_NO_FATAL_FAILURE(StartJob("slot-drain", &running));
  testing::Cluster& cluster = *cluster_;
  const int64_t drained_at = running.job().last_step();
  const std::string node = running.attempts(0).placement(1).node();
  const std::string slot = std::to_string(running.attempts(0).placement(1).slot());

  testing::CliResult drain =
      Cli({"drain", node, "--slot", slot, "--reason", "fan noise", "--wait", "--timeout", "20"});
  ASSERT_EQ(drain.code, 0) << drain.out << cluster.DebugLogs();
  EXPECT_NE(drain.out.find(id_ + ": moves its rank at the checkpoint its ranks save now"),
            std::string::npos)
      << drain.out;
  EXPECT_NE(drain.out.find(node + " slot " + slot + " is drained: no rank of " + id_),
            std::string::npos)
      << drain.out;

  v1::JobInfo after = WaitSecondAttempt(cluster, id_);
  ASSERT_EQ(after.job().state(), v1::RUNNING) << after.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(after.job().restarts(), 0) << "a drain is no failure of the job's";
  const std::string& why = after.attempts(0).end_reason();
  EXPECT_EQ(why.rfind("moving rank 1 off " + node + " slot " + slot + " (drained by ", 0), 0u)
      << why;
  EXPECT_NE(why.find(": fan noise) at the checkpoint of step "), std::string::npos) << why;
  EXPECT_GE(after.attempts(1).resume_step(), drained_at) << after.attempts(1).resume_checkpoint();
  for (const auto& r : after.attempts(1).placement()) EXPECT_NE(r.node(), node);
  auto listed = cluster.ListWorkers();
  ASSERT_TRUE(listed.ok());
  for (const auto& w : listed->workers()) {
    if (w.node().name() == node) {
      EXPECT_EQ(w.node().state(), v1::NODE_ALIVE) << "one slot out, not the node";
    }
  }
  ASSERT_TRUE(cluster.Cancel(id_).ok());
  ASSERT_TRUE(cluster.WaitJob(
      id_, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 60000, &after));
}

TEST_F(AgentDrainTest, DroverSuspendStopsTheJobAtACheckpointAndResumeContinuesFromIt) {
  v1::JobInfo running;
  ASSERT_NO_FATAL_FAILURE(StartJob("suspend", &running));
  testing::Cluster& cluster = *cluster_;
  const int64_t suspended_at = running.job().last_step();

  testing::CliResult suspend =
      Cli({"suspend", id_, "--reason", "maintenance", "--wait", "--timeout", "30"});
  ASSERT_EQ(suspend.code, 0) << suspend.out << cluster.DebugLogs();
  EXPECT_NE(suspend.out.find(id_ + " is suspending: it stops at its checkpoint after step"),
            std::string::npos)
      << suspend.out;
  EXPECT_NE(suspend.out.find(id_ + " SUSPENDED: after drover resume " + id_ +
                             " it resumes from the checkpoint of step "),
            std::string::npos)
      << suspend.out;
  // Its slots are given back: both trainers exit.
  ASSERT_TRUE(cluster.WaitJob(
      id_,
      [&](const v1::JobInfo&) {
        auto listed = cluster.ListWorkers();
        if (!listed.ok()) return false;
        for (const auto& w : listed->workers()) {
          if (w.free_slots() != 1) return false;
        }
        return true;
      },
      20000, &running))
      << cluster.DebugLogs();
  testing::CliResult status = Cli({"status", id_});
  EXPECT_NE(status.out.find("SUSPENDED"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("suspended by "), std::string::npos) << status.out;
  EXPECT_NE(status.out.find(": maintenance; drover resume " + id_), std::string::npos)
      << status.out;

  testing::CliResult resume = Cli({"resume", id_});
  ASSERT_EQ(resume.code, 0) << resume.out;
  EXPECT_EQ(resume.out, id_ + " PENDING\n");
  v1::JobInfo after = WaitSecondAttempt(cluster, id_);
  ASSERT_EQ(after.job().state(), v1::RUNNING) << after.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(after.job().restarts(), 0) << "a suspension is no failure of the job's";
  const std::string& why = after.attempts(0).end_reason();
  EXPECT_NE(why.find("suspended by "), std::string::npos) << why;
  EXPECT_NE(why.find(": maintenance at the checkpoint of step "), std::string::npos) << why;
  EXPECT_GE(after.attempts(1).resume_step(), suspended_at) << after.attempts(1).resume_checkpoint();
  std::printf("suspended at step %lld or after; attempt 2 resumed from step %lld\n",
              static_cast<long long>(suspended_at),
              static_cast<long long>(after.attempts(1).resume_step()));
  ASSERT_TRUE(cluster.Cancel(id_).ok());
  ASSERT_TRUE(cluster.WaitJob(
      id_, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 60000, &after));
}

TEST_F(AgentDrainTest, ATimeLimitStopsTheJobAtACheckpointThatASecondSubmitGoesOnFrom) {
  testing::ClusterOptions o;
  o.agents = 2;
  o.trainer = "drover-trainer";
  o.name = "time-limit";
  cluster_ = std::make_unique<testing::Cluster>(o);
  ASSERT_TRUE(cluster_->Start()) << cluster_->DebugLogs();
  const std::string spec = (cluster_->root() / "limited.yaml").string();
  std::ofstream(spec) << JobYaml("limited");
  testing::CliResult refused = Cli({"submit", spec, "--time-limit", "0"});
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("--time-limit 0 would stop the job before it starts"),
            std::string::npos)
      << refused.out;

  // 6 s of running, a tenth of a minute; no periodic checkpoint is due for a million steps.
  testing::CliResult submitted = Cli({"submit", spec, "--time-limit", "6s"});
  ASSERT_EQ(submitted.code, 0) << submitted.out;
  const std::string first = submitted.out.substr(0, submitted.out.find('\n'));
  v1::JobInfo ended;
  ASSERT_TRUE(cluster_->WaitJob(
      first, [](const v1::JobInfo& i) { return IsTerminal(i.job().state()); }, 90000, &ended))
      << ended.job().reason() << cluster_->DebugLogs();
  ASSERT_EQ(ended.job().state(), v1::FAILED) << ended.job().reason() << cluster_->DebugLogs();
  EXPECT_EQ(Cli({"wait", first}).code, 1);
  const v1::JobRecord& job = ended.job();
  const int64_t step = job.latest_checkpoint_step();
  ASSERT_GT(step, 0) << job.reason();
  EXPECT_EQ(job.restarts(), 0);
  EXPECT_EQ(job.reason().rfind("time limit reached: it ran ", 0), 0u) << job.reason();
  EXPECT_NE(job.reason().find(" of its 6.0s (resources.time_limit_minutes); stopped at the "
                              "checkpoint of step " +
                              std::to_string(step) + " ("),
            std::string::npos)
      << job.reason();
  ASSERT_EQ(ended.attempts_size(), 1);
  EXPECT_EQ(ended.attempts(0).end_reason(), "time limit reached");
  // It ran its limit, and stopped within a few steps and a save of it.
  const v1::AttemptRecord& a = ended.attempts(0);
  EXPECT_GE(a.ended_ms() - a.started_ms(), 6000);
  EXPECT_LT(a.ended_ms() - a.started_ms(), 16000);
  EXPECT_TRUE(fs::exists(dir_ / "limited" / "ckpt" / ("step_" + std::to_string(step))));
  std::printf("%s\n", job.reason().c_str());
  testing::CliResult status = Cli({"status", first});
  EXPECT_NE(status.out.find("time limit:  6.0s, "), std::string::npos) << status.out;
  EXPECT_NE(status.out.find(" used\n"), std::string::npos) << status.out;
  // Its trainers are gone: every slot is free.
  EXPECT_TRUE(testing::WaitUntil(
      [&] {
        auto listed = cluster_->ListWorkers();
        if (!listed.ok()) return false;
        for (const auto& w : listed->workers()) {
          if (w.free_slots() != 1) return false;
        }
        return true;
      },
      20000))
      << cluster_->DebugLogs();

  // Submitted again, with no limit and 5 steps more: it goes on from that checkpoint.
  submitted = Cli({"submit", spec, "--set", "train.steps=" + std::to_string(step + 5)});
  ASSERT_EQ(submitted.code, 0) << submitted.out;
  const std::string second = submitted.out.substr(0, submitted.out.find('\n'));
  ASSERT_TRUE(cluster_->WaitJob(
      second, [](const v1::JobInfo& i) { return IsTerminal(i.job().state()); }, 90000, &ended))
      << cluster_->DebugLogs();
  ASSERT_EQ(ended.job().state(), v1::SUCCEEDED) << ended.job().reason() << cluster_->DebugLogs();
  testing::CliResult logs = Cli({"logs", second});
  EXPECT_NE(logs.out.find("resuming from step " + std::to_string(step)), std::string::npos)
      << logs.out;
}

}  // namespace
}  // namespace drover
