// Chaos: two real multi-rank jobs (dp2 with ZeRO-2, and a 1F1B pipeline of two stages) on
// five one-slot agents, through a scripted schedule of kill -9 of trainers, of agents and
// of the coordinator. Each event waits until both jobs saved a checkpoint since the last
// one, so every failure lands in the middle of training. Both jobs must succeed, and their
// final parameters must equal those of an uninterrupted `drover train --nproc 2`, bit for
// bit: a resume at the same mesh replays exactly the samples and the arithmetic.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "tests/integration/cluster.h"
#include "tests/integration/train_process.h"

namespace drover {
namespace {

class ChaosTest : public TrainProcessFixture {
 protected:
  std::string Yaml(const std::string& name, const std::string& parallel) {
    return "name: " + name + "\noutput_dir: " + (dir_ / name).string() +
           "\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
           "data: {train: " +
           (dir_ / "train.bin").string() +
           "}\ntrain: {steps: 600, global_batch: 8, micro_batch: 2, seq_len: 16, lr: 0.003, "
           "warmup_steps: 5, eval_every: 0, grad_clip: 1.0}\n"
           "parallel: {" +
           parallel +
           ", timeout_s: 20}\n"
           "checkpoint: {every_steps: 10, keep_last: 3}\n"
           "resources: {world_size: {min: 2, max: 2}, threads_per_rank: 1}\n"
           "fault_tolerance: {max_restarts: 20}\n";
  }
};

TEST_F(ChaosTest, JobsSurviveKilledTrainersAgentsAndCoordinatorBitForBit) {
  testing::ClusterOptions o;
  o.agents = 5;
  o.trainer = "drover-trainer";
  o.name = "chaos";
  o.heartbeat_timeout_ms = 2000;  // 4 trainers and 5 agents share this machine's cores
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  const std::string zero_yaml = Yaml("zero", "zero_stage: 2");
  const std::string pipe_yaml = Yaml("pipe", "pp: 2, pp_schedule: 1f1b");
  auto zero = cluster.Submit(zero_yaml);
  auto pipe = cluster.Submit(pipe_yaml);
  ASSERT_TRUE(zero.ok() && pipe.ok()) << zero.status() << pipe.status();
  const std::vector<std::string> ids = {*zero, *pipe};

  // Waits until every job saved a checkpoint newer than `after` (or finished); returns the
  // newest checkpoint step per job.
  auto checkpoint_after = [&](const std::vector<int64_t>& after) {
    std::vector<int64_t> newest(ids.size(), -1);
    for (size_t j = 0; j < ids.size(); ++j) {
      v1::JobInfo info;
      const bool ok = cluster.WaitJob(
          ids[j],
          [&](const v1::JobInfo& i) {
            return i.job().state() == v1::SUCCEEDED || i.job().state() == v1::FAILED ||
                   (i.job().state() == v1::RUNNING && !i.trainers().empty() &&
                    i.job().latest_checkpoint_step() > after[j]);
          },
          60000, &info);
      EXPECT_TRUE(ok) << ids[j] << ": " << info.job().reason() << cluster.DebugLogs();
      EXPECT_NE(info.job().state(), v1::FAILED) << info.job().reason();
      newest[j] = info.job().latest_checkpoint_step();
    }
    return newest;
  };
  // A live trainer of `rank` of the job's current attempt, and the node it runs on, once
  // its agent lists it (after a coordinator restart, ranks are listed as their agents come
  // back); -1 if the job ended first.
  auto trainer_of = [&](const std::string& id, int rank, std::string* node) -> pid_t {
    pid_t pid = -1;
    testing::WaitUntil(
        [&] {
          auto info = cluster.GetJob(id);
          if (!info.ok()) return false;
          if (info->job().state() == v1::SUCCEEDED || info->job().state() == v1::FAILED) {
            return true;
          }
          if (info->job().state() != v1::RUNNING) return false;
          for (const auto& t : info->trainers()) {
            if (t.rank() == rank && t.attempt() == info->job().attempt() && t.pid() > 0 &&
                t.state() == v1::TRAINER_RUNNING) {
              if (node) *node = info->job().placement(rank).node();
              pid = static_cast<pid_t>(t.pid());
              return true;
            }
          }
          return false;
        },
        30000, 20);
    return pid;
  };
  auto restart_agent = [&](const std::string& node) {
    cluster.agent(node)->Kill(SIGKILL);
    cluster.StartAgent(std::stoi(node.substr(1)));
  };

  std::vector<int64_t> at = checkpoint_after({0, 0});
  int events = 0;
  // 1. A trainer of the ZeRO job.
  if (pid_t p = trainer_of(ids[0], 1, nullptr); p > 0) events += kill(p, SIGKILL) == 0;
  at = checkpoint_after(at);
  // 2. The agent of the pipeline's first stage, with its trainer; it comes back.
  std::string node;
  if (trainer_of(ids[1], 0, &node) > 0) {
    cluster.agent(node)->Kill(SIGKILL);
    ++events;
    at = checkpoint_after(at);
    cluster.StartAgent(std::stoi(node.substr(1)));
  }
  // 3. The coordinator, restarted at once from its state.
  cluster.coordinator()->Kill(SIGKILL);
  cluster.StartCoordinator();
  ++events;
  at = checkpoint_after(at);
  // 4. A pipeline trainer and an agent of the ZeRO job at once.
  if (pid_t p = trainer_of(ids[1], 1, nullptr); p > 0) events += kill(p, SIGKILL) == 0;
  if (trainer_of(ids[0], 0, &node) > 0) {
    restart_agent(node);
    ++events;
  }
  at = checkpoint_after(at);
  EXPECT_GE(events, 5) << "the jobs finished before the schedule did; make them longer";

  for (const std::string& id : ids) {
    v1::JobInfo info;
    ASSERT_TRUE(cluster.WaitJob(
        id,
        [](const v1::JobInfo& i) {
          return i.job().state() == v1::SUCCEEDED || i.job().state() == v1::FAILED ||
                 i.job().state() == v1::CANCELLED;
        },
        120000, &info))
        << cluster.DebugLogs();
    ASSERT_EQ(info.job().state(), v1::SUCCEEDED) << info.job().reason() << cluster.DebugLogs();
    EXPECT_GE(info.job().attempt(), 2) << id;
    std::cout << id << ": " << info.job().attempt() << " attempts, " << info.job().restarts()
              << " restarts\n";
  }

  // Uninterrupted runs of the same specs, same mesh.
  for (const auto& [name, yaml] :
       std::vector<std::pair<std::string, std::string>>{{"zero", zero_yaml}, {"pipe", pipe_yaml}}) {
    std::string ref = yaml;
    ref.replace(ref.find("name: " + name), 6 + name.size(), "name: ref-" + name);
    ref.replace(ref.find((dir_ / name).string()), (dir_ / name).string().size(),
                (dir_ / ("ref-" + name)).string());
    std::ofstream(dir_ / ("ref-" + name + ".yaml")) << ref;
    const pid_t p = Spawn({kBin + "drover", "train", (dir_ / ("ref-" + name + ".yaml")).string(),
                           "--threads", "1", "--nproc", "2"});
    ASSERT_EQ(Wait(p), 0) << Log();
    const std::vector<float> want = ModelParams(dir_ / ("ref-" + name) / "model.bin");
    const std::vector<float> got = ModelParams(dir_ / name / "model.bin");
    ASSERT_GT(want.size(), 0u);
    ASSERT_EQ(got.size(), want.size()) << name;
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << name << ": " << differ << " of " << want.size()
                          << " parameters differ from the uninterrupted run";
  }
}

}  // namespace
}  // namespace drover
