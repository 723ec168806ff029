// cli/top_view.h: the frame `drover top` paints.
#include "cli/top_view.h"

#include <gtest/gtest.h>

namespace drover::cli {
namespace {

constexpr int64_t kNow = 1'000'000;

v1::WorkerInfo Worker(const std::string& name, v1::NodeState state, int slots, int busy,
                      int64_t heartbeat_ms) {
  v1::WorkerInfo w;
  w.mutable_node()->set_name(name);
  w.mutable_node()->set_state(state);
  w.mutable_node()->set_last_heartbeat_ms(heartbeat_ms);
  for (int i = 0; i < slots; ++i) w.mutable_node()->add_slots()->set_index(i);
  for (int i = 0; i < busy; ++i) w.add_trainers()->set_state(v1::TRAINER_RUNNING);
  return w;
}

// A running job of `steps` steps at `step`, one trainer of the current attempt per rank.
v1::JobInfo Job(const std::string& id, v1::JobState state, int64_t step, int64_t furthest,
                int world, double step_ms) {
  v1::JobInfo info;
  v1::JobRecord& j = *info.mutable_job();
  j.set_job_id(id);
  j.set_name("shakespeare");
  j.set_spec_yaml("name: shakespeare\ndata: {train: t.bin}\ntrain: {steps: 300}\n");
  j.set_state(state);
  j.set_attempt(2);
  j.set_last_step(step);
  j.set_furthest_step(furthest);
  j.set_last_loss(1.23456);
  j.set_tokens_per_s(5120.4);
  for (int r = 0; r < world; ++r) {
    j.add_placement()->set_rank(r);
    v1::TrainerStatus& t = *info.add_trainers();
    t.set_attempt(2);
    t.set_rank(r);
    t.set_state(v1::TRAINER_RUNNING);
    t.mutable_progress()->set_step_ms(step_ms * (r + 1));  // rank 1 is the slow one
  }
  return info;
}

TopSnapshot Cluster() {
  TopSnapshot s;
  s.coordinator = "127.0.0.1:7600";
  s.now_ms = kNow;
  *s.workers.add_workers() = Worker("w1", v1::NODE_ALIVE, 2, 2, kNow - 400);
  *s.workers.add_workers() = Worker("w2", v1::NODE_DEAD, 1, 0, kNow - 75'000);
  return s;
}

TEST(RenderTopTest, NodesAndJobsWithProgressLossSpeedAndEtaAtTheSlowestRank) {
  TopSnapshot s = Cluster();
  s.jobs.push_back(Job("j-1", v1::RUNNING, 150, 150, 2, 100));
  // 150 steps left at the slowest rank's 200 ms: 30 s.
  EXPECT_EQ(RenderTop(s, 0),
            "drover top - 127.0.0.1:7600 - nodes 1/2 alive, slots 2/3 used - jobs 1 running, 0 "
            "recovering, 0 pending\n"
            "\n"
            "NODE  STATE  SLOTS  HEARTBEAT\n"
            "w1    ALIVE  2/2    0.4s\n"
            "w2    DEAD   0/1    1m15s\n"
            "\n"
            "JOB  NAME         STATE    ATTEMPT  WORLD  STEP     PROGRESS  LOSS    TOK/S  ETA\n"
            "j-1  shakespeare  RUNNING  2        2      150/300  50.0%     1.2346  5120   30.0s\n");
}

// Where an agent sends GPU readings, a GPUS column gives each node's mean busy share and how
// many of its GPUs are slowed down; a node without readings shows "-".
TEST(RenderTopTest, GpuNodesShowHowBusyTheirGpusAreAndHowManyAreSlowed) {
  TopSnapshot s = Cluster();
  v1::WorkerInfo& w1 = *s.workers.mutable_workers(0);
  w1.add_gpus()->set_utilization_pct(97);
  v1::GpuTelemetry* hot = w1.add_gpus();
  hot->set_utilization_pct(90);
  hot->set_slowdown("thermal (hardware)");
  const std::string frame = RenderTop(s, 0);
  EXPECT_NE(frame.find("NODE  STATE  SLOTS  HEARTBEAT  GPUS\n"
                       "w1    ALIVE  2/2    0.4s       94% busy, 1 slowed\n"
                       "w2    DEAD   0/1    1m15s      -\n"),
            std::string::npos)
      << frame;
}

TEST(RenderTopTest, ASlotOutForItsFailedGpuIsCountedOnItsNode) {
  TopSnapshot s = Cluster();
  s.workers.set_now_ms(kNow + 5);  // the coordinator's clock decides
  v1::NodeRecord& w1 = *s.workers.mutable_workers(0)->mutable_node();
  w1.add_slot_faults()->set_cordon_until_ms(kNow + 6);
  w1.add_slot_faults()->set_cordon_until_ms(kNow + 5);  // ended
  const std::string frame = RenderTop(s, 0);
  EXPECT_NE(frame.find("w1    ALIVE  2/2 (1 out)  0.4s\n"), std::string::npos) << frame;
  EXPECT_NE(frame.find("w2    DEAD   0/1          1m15s\n"), std::string::npos) << frame;
  // A slot its agent's health check reports unfit is out too, whatever its cordon.
  w1.add_unhealthy_slots()->set_slot(1);
  const std::string unfit = RenderTop(s, 0);
  EXPECT_NE(unfit.find("w1    ALIVE  2/2 (2 out)  0.4s\n"), std::string::npos) << unfit;
}

TEST(RenderTopTest, StepBelowTheFurthestReachedIsMarkedRecomputed) {
  TopSnapshot s = Cluster();
  s.jobs.push_back(Job("j-1", v1::RUNNING, 140, 160, 1, 100));
  const std::string frame = RenderTop(s, 0);
  EXPECT_NE(frame.find(" 140/300* "), std::string::npos) << frame;
  EXPECT_NE(frame.find("* recomputed after restart"), std::string::npos) << frame;

  s.jobs[0] = Job("j-1", v1::RUNNING, 160, 160, 1, 100);
  EXPECT_EQ(RenderTop(s, 0).find("recomputed"), std::string::npos);
}

// Where a running job's rank 0 reports its model FLOPs utilisation, an MFU column shows it
// after TOK/S; a job without one (a CPU job, an unknown GPU, not running) shows "-", and a
// table where no job has one has no such column.
TEST(RenderTopTest, JobsWhoseRankZeroKnowsItsMfuShowIt) {
  TopSnapshot s = Cluster();
  s.jobs.push_back(Job("j-1", v1::RUNNING, 150, 150, 2, 100));
  s.jobs.push_back(Job("j-2", v1::RUNNING, 150, 150, 1, 100));
  s.jobs.push_back(Job("j-3", v1::PENDING, 0, 0, 0, 0));
  // Rank 1's figure is not the job's; rank 0's of an earlier attempt neither.
  s.jobs[0].mutable_trainers(0)->mutable_progress()->set_mfu(0.4815);
  s.jobs[0].mutable_trainers(1)->mutable_progress()->set_mfu(0.9);
  v1::TrainerStatus& stale = *s.jobs[1].add_trainers();
  stale.set_attempt(1);
  stale.set_rank(0);
  stale.set_state(v1::TRAINER_RUNNING);
  stale.mutable_progress()->set_mfu(0.3);
  // Listed before the ranks that count, as an agent's listing may have them.
  s.jobs[0].mutable_trainers()->SwapElements(0, 1);
  s.jobs[1].mutable_trainers()->SwapElements(0, 1);
  const std::string frame = RenderTop(s, 0);
  EXPECT_NE(frame.find("JOB  NAME         STATE    ATTEMPT  WORLD  STEP     PROGRESS  LOSS    "
                       "TOK/S  MFU    ETA\n"
                       "j-1  shakespeare  RUNNING  2        2      150/300  50.0%     1.2346  "
                       "5120   48.1%  30.0s\n"
                       "j-2  shakespeare  RUNNING  2        1      150/300  50.0%     1.2346  "
                       "5120   -      15.0s\n"
                       "j-3  shakespeare  PENDING  2        0      0/300    0.0%      -       "
                       "-      -      -\n"),
            std::string::npos)
      << frame;

  s.jobs[0].mutable_trainers(1)->mutable_progress()->set_mfu(0);
  EXPECT_EQ(RenderTop(s, 0).find("MFU"), std::string::npos);
}

TEST(RenderTopTest, PendingJobShowsNoSpeedOrEtaAndRecoveringIsCounted) {
  TopSnapshot s = Cluster();
  s.jobs.push_back(Job("j-2", v1::PENDING, 0, 0, 0, 0));
  s.jobs.push_back(Job("j-3", v1::RECOVERING, 90, 120, 0, 100));
  const std::string frame = RenderTop(s, 0);
  EXPECT_NE(frame.find("jobs 0 running, 1 recovering, 1 pending"), std::string::npos) << frame;
  EXPECT_NE(
      frame.find(
          "j-2  shakespeare  PENDING     2        0      0/300    0.0%      -       -      -\n"),
      std::string::npos)
      << frame;
  EXPECT_NE(
      frame.find(
          "j-3  shakespeare  RECOVERING  2        0      90/300*  30.0%     1.2346  -      -\n"),
      std::string::npos)
      << frame;
}

// A suspended job holds no slots but is not finished: it is listed, and counted in the
// title once there is one (drover resume places it again).
TEST(RenderTopTest, SuspendedJobsAreListedAndCounted) {
  TopSnapshot s = Cluster();
  s.jobs.push_back(Job("j-4", v1::SUSPENDED, 150, 150, 0, 0));
  const std::string frame = RenderTop(s, 0);
  EXPECT_NE(frame.find("jobs 0 running, 0 recovering, 0 pending, 1 suspended\n"), std::string::npos)
      << frame;
  EXPECT_NE(frame.find("j-4  shakespeare  SUSPENDED  2        0      150/300  50.0%     1.2346  -"),
            std::string::npos)
      << frame;
}

TEST(RenderTopTest, EmptyClusterSaysSo) {
  TopSnapshot s;
  s.coordinator = "c:1";
  EXPECT_EQ(RenderTop(s, 0),
            "drover top - c:1 - nodes 0/0 alive, slots 0/0 used - jobs 0 running, 0 recovering, "
            "0 pending\n\nno worker nodes\n\nno active jobs\n");
}

TEST(RenderTopTest, LinesAreCutToTheWidthWithoutTrailingBlanks) {
  TopSnapshot s = Cluster();
  s.jobs.push_back(Job("j-1", v1::RUNNING, 150, 150, 2, 100));
  const std::string frame = RenderTop(s, 20);
  size_t start = 0;
  int lines = 0;
  while (start < frame.size()) {
    const size_t end = frame.find('\n', start);
    ASSERT_NE(end, std::string::npos);
    const std::string line = frame.substr(start, end - start);
    EXPECT_LE(line.size(), 20u) << line;
    if (!line.empty()) {
      EXPECT_NE(line.back(), ' ') << line;
    }
    start = end + 1;
    ++lines;
  }
  EXPECT_EQ(lines, 8);
  EXPECT_NE(frame.find("j-1  shakespeare  RU\n"), std::string::npos) << frame;
}

TEST(RenderTopTest, JobWhoseSpecDoesNotParseShowsItsStepWithoutTotal) {
  TopSnapshot s = Cluster();
  s.jobs.push_back(Job("j-1", v1::RUNNING, 7, 7, 1, 100));
  s.jobs[0].mutable_job()->set_spec_yaml("not: [a spec");
  const std::string frame = RenderTop(s, 0);
  EXPECT_NE(frame.find("  7     -         1.2346  5120   -\n"), std::string::npos) << frame;
}

}  // namespace
}  // namespace drover::cli
