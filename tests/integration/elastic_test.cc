// Elastic training through the coordinator, with the real trainer: a job of world size
// [2, 4] on four one-slot agents loses two of them, goes on at 2 from its newest
// checkpoint, and grows back to 4 at the checkpoint after the two agents return. Every
// step's loss, whichever attempt and world size computed it, equals one process's.
// And preemption: a job of higher priority gets its slots from a running one, which
// shrinks at a checkpoint it is asked to save at once and grows back once the other is
// done; `drover checkpoint` asks a job for one by hand.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/cluster.h"
#include "tests/integration/train_process.h"

namespace drover {
namespace {

struct MetricsLine {
  int64_t step = 0;
  double loss = 0;
  int64_t world_size = 0;
  int64_t attempt = 0;
};

double Field(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  return at == std::string::npos ? NAN : std::stod(line.substr(at + key.size() + 3));
}

std::vector<MetricsLine> ReadMetrics(const fs::path& path) {
  std::ifstream in(path);
  std::vector<MetricsLine> out;
  for (std::string l; std::getline(in, l);) {
    if (l.find("\"loss\":") == std::string::npos) continue;
    out.push_back({static_cast<int64_t>(Field(l, "step")), Field(l, "loss"),
                   static_cast<int64_t>(Field(l, "world_size")),
                   static_cast<int64_t>(Field(l, "attempt"))});
  }
  return out;
}

class ElasticTest : public TrainProcessFixture {
 protected:
  // Global batch 8 in micro-batches of 2: dp 1, 2 or 4, so [2, 4] allows 2 and 4 (not 3).
  // A constant learning rate, so that a reference run of fewer steps computes the same
  // steps as the long job.
  std::string Yaml(const std::string& name, int64_t steps, int min = 2, int max = 4,
                   int64_t checkpoint_every = 20, const std::string& parallel = "zero_stage: 1") {
    return "name: " + name + "\noutput_dir: " + (dir_ / name).string() +
           "\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
           "data: {train: " +
           (dir_ / "train.bin").string() + "}\ntrain: {steps: " + std::to_string(steps) +
           ", global_batch: 8, micro_batch: 2, seq_len: 16, lr: 0.002, schedule: constant, "
           "warmup_steps: 2, eval_every: 0}\n"
           "parallel: {" +
           parallel +
           ", timeout_s: 20}\n"
           "checkpoint: {every_steps: " +
           std::to_string(checkpoint_every) +
           ", keep_last: 3}\n"
           "resources: {world_size: {min: " +
           std::to_string(min) + ", max: " + std::to_string(max) +
           "}, threads_per_rank: 1}\n"
           "fault_tolerance: {max_restarts: 10}\n";
  }

  // Lines of `got` per world size; *last: the furthest step.
  static std::map<int64_t, int> SizesSeen(const std::vector<MetricsLine>& got, int64_t* last) {
    std::map<int64_t, int> sizes;
    *last = 0;
    for (const MetricsLine& m : got) {
      *last = std::max(*last, m.step);
      ++sizes[m.world_size];
    }
    return sizes;
  }

  // Trains `ref_yaml` (the job's model, data and batch, named `ref`, of the furthest step in
  // `got`) in one process with `sets`, and expects every line of `got`, of any attempt and
  // world size, to have the loss it computes.
  void ExpectOneProcessLosses(const std::vector<MetricsLine>& got, const std::string& ref,
                              const std::string& ref_yaml, const std::vector<std::string>& sets) {
    const fs::path yaml = dir_ / (ref + ".yaml");
    std::ofstream(yaml) << ref_yaml;
    std::vector<std::string> argv = {kBin + "drover", "train", yaml.string(), "--threads", "1",
                                     "--nproc",       "1",     "--fresh"};
    for (const std::string& s : sets) argv.insert(argv.end(), {"--set", s});
    ASSERT_EQ(Wait(Spawn(argv)), 0) << Log();
    std::map<int64_t, double> want;
    for (const MetricsLine& m : ReadMetrics(dir_ / ref / "metrics.jsonl")) want[m.step] = m.loss;
    int64_t last = 0;
    SizesSeen(got, &last);
    ASSERT_EQ(static_cast<int64_t>(want.size()), last);
    for (const MetricsLine& m : got) {
      ASSERT_TRUE(want.count(m.step)) << m.step;
      EXPECT_NEAR(m.loss, want[m.step], 1e-5 * want[m.step])
          << "step " << m.step << " of attempt " << m.attempt << " at world size " << m.world_size;
    }
  }
};

// The attempt running now, once it trained past a checkpoint of its own.
bool CheckpointedAt(const v1::JobInfo& i, int world_size) {
  if (i.job().state() != v1::RUNNING || i.attempts_size() == 0) return false;
  const v1::AttemptRecord& a = *i.attempts().rbegin();
  return a.attempt() == i.job().attempt() && a.world_size() == world_size &&
         i.job().latest_checkpoint_step() > std::max<int64_t>(a.resume_step(), 0);
}

TEST_F(ElasticTest, ShrinksWhenAgentsDieAndGrowsBackAtTheNextCheckpoint) {
  testing::ClusterOptions o;
  o.agents = 4;
  o.trainer = "drover-trainer";
  o.name = "elastic";
  o.heartbeat_timeout_ms = 2000;  // 8 trainers and agents share this machine's cores
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  auto id = cluster.Submit(Yaml("elastic", 1000000));
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobInfo info;
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return CheckpointedAt(i, 4); }, 60000, &info))
      << cluster.DebugLogs();

  // Two agents die with their trainers: the job goes on at 2 on the others.
  cluster.agent("w2")->Kill(SIGKILL);
  cluster.agent("w3")->Kill(SIGKILL);
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return CheckpointedAt(i, 2); }, 60000, &info))
      << info.job().reason() << cluster.DebugLogs();
  const int64_t restarts = info.job().restarts();
  const int64_t small_attempt = info.job().attempt();

  // They come back: at its next checkpoint the job restarts at 4, not counted as a failure.
  cluster.StartAgent(2);
  cluster.StartAgent(3);
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return CheckpointedAt(i, 4); }, 60000, &info))
      << info.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(info.job().restarts(), restarts);
  const v1::AttemptRecord& small = info.attempts(static_cast<int>(small_attempt) - 1);
  const v1::AttemptRecord& grown = *info.attempts().rbegin();
  EXPECT_EQ(small.world_size(), 2);
  EXPECT_EQ(small.end_reason().rfind("resized: growing from 2 to 4 ranks at the checkpoint of "
                                     "step ",
                                     0),
            0u)
      << small.end_reason();
  EXPECT_EQ(grown.attempt(), small_attempt + 1);
  EXPECT_GT(grown.resume_step(), small.resume_step());
  ASSERT_TRUE(cluster.Cancel(*id).ok());
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return i.trainers_size() == 0; }, 20000))
      << cluster.DebugLogs();

  // Every line, of every attempt and world size, has the loss one process computes.
  const std::vector<MetricsLine> got = ReadMetrics(dir_ / "elastic" / "metrics.jsonl");
  ASSERT_FALSE(got.empty());
  int64_t last = 0;
  std::map<int64_t, int> sizes_seen = SizesSeen(got, &last);
  EXPECT_GT(sizes_seen[2], 0);
  EXPECT_GT(sizes_seen[4], 0);
  std::cout << "steps " << last << ", lines at world size 4: " << sizes_seen[4]
            << ", at 2: " << sizes_seen[2] << ", attempts " << info.job().attempt() << "\n";
  ExpectOneProcessLosses(got, "ref", Yaml("ref", last), {});
}

// Hybrid sharding (ZeRO-3 in shard groups of 2) admits only whole replicas: at a global
// batch of 24 the batch allows 3 ranks, but with one of four nodes gone the job runs at 2
// (dp 3 is no multiple of the shard group), and at 4 again, in 2 replicas, once the node is
// back; each world size resumes the other's sharded checkpoint, and every step has the loss
// of one process.
TEST_F(ElasticTest, AHybridShardedJobShrinksAndGrowsByWholeReplicas) {
  testing::ClusterOptions o;
  o.agents = 4;
  o.trainer = "drover-trainer";
  o.name = "hybrid";
  o.heartbeat_timeout_ms = 2000;
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  auto yaml = [&](const std::string& name, int64_t steps) {
    std::string y = Yaml(name, steps, 2, 4, 20, "zero_stage: 3, dp_shard: 2");
    y.replace(y.find("global_batch: 8"), 15, "global_batch: 24");
    return y;
  };
  auto id = cluster.Submit(yaml("hybrid", 1000000));
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobInfo info;
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return CheckpointedAt(i, 4); }, 60000, &info))
      << cluster.DebugLogs();

  cluster.agent("w3")->Kill(SIGKILL);
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return CheckpointedAt(i, 2); }, 60000, &info))
      << info.job().reason() << cluster.DebugLogs();
  cluster.StartAgent(3);
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return CheckpointedAt(i, 4); }, 60000, &info))
      << info.job().reason() << cluster.DebugLogs();
  for (const v1::AttemptRecord& a : info.attempts()) {
    EXPECT_TRUE(a.world_size() == 2 || a.world_size() == 4)
        << "attempt " << a.attempt() << " at world size " << a.world_size();
  }
  ASSERT_TRUE(cluster.Cancel(*id).ok());
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return i.trainers_size() == 0; }, 20000))
      << cluster.DebugLogs();

  const std::vector<MetricsLine> got = ReadMetrics(dir_ / "hybrid" / "metrics.jsonl");
  int64_t last = 0;
  std::map<int64_t, int> sizes_seen = SizesSeen(got, &last);
  EXPECT_GT(sizes_seen[2], 0);
  EXPECT_GT(sizes_seen[4], 0);
  EXPECT_EQ(sizes_seen.count(3), 0u);
  ExpectOneProcessLosses(got, "hybrid-ref", yaml("hybrid-ref", last),
                         {"parallel.zero_stage=0", "parallel.dp_shard=all"});
}

// The running ranks' newest step (0 before the first report).
int64_t TrainedSteps(const v1::JobInfo& i) {
  int64_t step = 0;
  for (const v1::TrainerStatus& t : i.trainers()) step = std::max(step, t.progress().step());
  return step;
}

// Every checkpoint here is one asked for: the interval (100000 steps) is never reached.
TEST_F(ElasticTest, ALowerPriorityJobShrinksForAHigherOneAndGrowsBackAfterIt) {
  testing::ClusterOptions o;
  o.agents = 1;
  o.slots_per_agent = 2;
  o.trainer = "drover-trainer";
  o.name = "preempt";
  o.heartbeat_timeout_ms = 2000;
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  auto low = cluster.Submit(Yaml("low", 1000000, 1, 2, 100000));
  ASSERT_TRUE(low.ok()) << low.status();
  v1::JobInfo info;
  ASSERT_TRUE(cluster.WaitJob(
      *low,
      [](const v1::JobInfo& i) { return i.job().state() == v1::RUNNING && TrainedSteps(i) >= 2; },
      60000, &info))
      << cluster.DebugLogs();

  // By hand: `drover checkpoint --wait` returns once the checkpoint is complete.
  testing::CliResult asked = testing::RunCli(
      dir_, {"--coordinator", cluster.address(), "checkpoint", *low, "--wait", "--timeout", "15"});
  ASSERT_EQ(asked.code, 0) << asked.out << cluster.DebugLogs();
  EXPECT_NE(asked.out.find(": checkpoint requested; its ranks save it at the end of the step"),
            std::string::npos)
      << asked.out;
  EXPECT_NE(asked.out.find(" complete: "), std::string::npos) << asked.out;
  ASSERT_TRUE(cluster.WaitJob(
      *low, [](const v1::JobInfo&) { return true; }, 1000, &info));
  EXPECT_GE(info.job().latest_checkpoint_step(), 2);
  EXPECT_EQ(info.job().attempt(), 1);

  // A one-rank job of priority 5: the running job is asked for a checkpoint at once, gives
  // it one of its two slots there, and takes it back at the checkpoint it is asked for
  // once the other finished.
  auto high = cluster.Submit(Yaml("high", 30, 1, 1), 5);
  ASSERT_TRUE(high.ok()) << high.status();
  ASSERT_TRUE(cluster.WaitJob(
      *high, [](const v1::JobInfo& i) { return i.job().state() == v1::SUCCEEDED; }, 90000, &info))
      << info.job().reason() << cluster.DebugLogs();
  ASSERT_TRUE(cluster.WaitJob(
      *low,
      [](const v1::JobInfo& i) {
        return i.attempts_size() >= 3 && i.job().state() == v1::RUNNING &&
               i.job().placement_size() == 2;
      },
      60000, &info))
      << info.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(info.job().restarts(), 0);
  ASSERT_EQ(info.attempts_size(), 3);
  EXPECT_EQ(info.attempts(0).end_reason().rfind("resized: shrinking from 2 to 1 ranks at the "
                                                "checkpoint of step ",
                                                0),
            0u)
      << info.attempts(0).end_reason();
  EXPECT_NE(info.attempts(0).end_reason().find("for job " + *high + " (priority 5)"),
            std::string::npos)
      << info.attempts(0).end_reason();
  EXPECT_EQ(info.attempts(1).world_size(), 1);
  // It resumed from the checkpoint it shrank at, or from one its ranks completed while
  // they stopped.
  const std::string& why = info.attempts(0).end_reason();
  const size_t at = why.find("of step ");
  ASSERT_NE(at, std::string::npos) << why;
  EXPECT_GE(info.attempts(1).resume_step(), std::stoll(why.substr(at + 8))) << why;
  EXPECT_EQ(info.attempts(1).end_reason().rfind("resized: growing from 1 to 2 ranks", 0), 0u)
      << info.attempts(1).end_reason();
  EXPECT_GT(info.attempts(2).resume_step(), info.attempts(1).resume_step());
  ASSERT_TRUE(cluster.Cancel(*low).ok());
  ASSERT_TRUE(cluster.WaitJob(
      *low, [](const v1::JobInfo& i) { return i.trainers_size() == 0; }, 20000))
      << cluster.DebugLogs();
}

}  // namespace
}  // namespace drover
