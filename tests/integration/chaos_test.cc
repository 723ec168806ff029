// Chaos: two real multi-rank jobs (dp2 with ZeRO-2, and a 1F1B pipeline of two stages) on
// five one-slot agents, through a scripted schedule of kill -9 of trainers, of agents and
// of the coordinator. Each event waits until both jobs saved a checkpoint since the last
// one, so every failure lands in the middle of training. The jobs are far longer than the
// schedule (and their learning rate constant after warm-up, so nothing depends on their
// length): however fast or slow this machine is, every event hits a running job. After the
// last one both jobs are cancelled, and each one's newest checkpoint (weights and AdamW
// moments) must equal, bit for bit, that of an uninterrupted `drover train --nproc 2` of
// the same spec run to that step: a resume at the same mesh replays exactly the samples
// and the arithmetic.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/integration/cluster.h"
#include "tests/integration/train_process.h"
#include "worker/engine/ckpt/checkpoint.h"

namespace drover {
namespace {

class ChaosTest : public TrainProcessFixture {
 protected:
  std::string Yaml(const std::string& name, const std::string& parallel, int64_t steps) {
    return "name: " + name + "\noutput_dir: " + (dir_ / name).string() +
           "\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
           "data: {train: " +
           (dir_ / "train.bin").string() + "}\ntrain: {steps: " + std::to_string(steps) +
           ", global_batch: 8, micro_batch: 2, seq_len: 16, lr: 0.003, "
           "warmup_steps: 5, schedule: constant, eval_every: 0, grad_clip: 1.0}\n"
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
  const std::string zero_parallel = "zero_stage: 2";
  const std::string pipe_parallel = "pp: 2, pp_schedule: 1f1b";
  constexpr int64_t kSteps = 1000000;  // never reached: the test cancels both jobs
  const std::string zero_yaml = Yaml("zero", zero_parallel, kSteps);
  const std::string pipe_yaml = Yaml("pipe", pipe_parallel, kSteps);
  auto zero = cluster.Submit(zero_yaml);
  auto pipe = cluster.Submit(pipe_yaml);
  ASSERT_TRUE(zero.ok() && pipe.ok()) << zero.status() << pipe.status();
  const std::vector<std::string> ids = {*zero, *pipe};

  // The attempt each job runs now.
  auto attempts = [&] {
    std::vector<int64_t> a(ids.size(), 0);
    for (size_t j = 0; j < ids.size(); ++j) {
      auto info = cluster.GetJob(ids[j]);
      if (info.ok()) a[j] = info->job().attempt();
    }
    return a;
  };
  // Jobs failed by the last event: each must be in a later attempt than `before` says before
  // its next checkpoint counts (a checkpoint the failed attempt committed while its failure
  // was on its way to the coordinator does not).
  std::vector<int64_t> min_attempt(ids.size(), 0);
  auto failed = [&](size_t j, const std::vector<int64_t>& before) {
    min_attempt[j] = before[j] + 1;
  };
  // Waits until every job saved a checkpoint newer than `after` (in at least its
  // min_attempt); returns the newest checkpoint step per job.
  auto checkpoint_after = [&](const std::vector<int64_t>& after) {
    std::vector<int64_t> newest(ids.size(), -1);
    for (size_t j = 0; j < ids.size(); ++j) {
      v1::JobInfo info;
      const bool ok = cluster.WaitJob(
          ids[j],
          [&](const v1::JobInfo& i) {
            return i.job().state() == v1::FAILED ||
                   (i.job().state() == v1::RUNNING && !i.trainers().empty() &&
                    i.job().attempt() >= min_attempt[j] &&
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
  // back); -1 if there is none within 30 s.
  auto trainer_of = [&](const std::string& id, int rank, std::string* node) -> pid_t {
    pid_t pid = -1;
    testing::WaitUntil(
        [&] {
          auto info = cluster.GetJob(id);
          if (!info.ok()) return false;
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
  std::vector<int64_t> before = attempts();
  if (pid_t p = trainer_of(ids[0], 1, nullptr); p > 0 && kill(p, SIGKILL) == 0) {
    ++events;
    failed(0, before);
  }
  at = checkpoint_after(at);
  // 2. The agent of the pipeline's first stage, with its trainer; it comes back.
  std::string node;
  before = attempts();
  if (trainer_of(ids[1], 0, &node) > 0) {
    cluster.agent(node)->Kill(SIGKILL);
    ++events;
    failed(1, before);
    at = checkpoint_after(at);
    cluster.StartAgent(std::stoi(node.substr(1)));
  }
  // 3. The coordinator, restarted at once from its state.
  cluster.coordinator()->Kill(SIGKILL);
  cluster.StartCoordinator();
  ++events;
  at = checkpoint_after(at);
  // 4. A pipeline trainer and an agent of the ZeRO job at once.
  before = attempts();
  if (pid_t p = trainer_of(ids[1], 1, nullptr); p > 0 && kill(p, SIGKILL) == 0) {
    ++events;
    failed(1, before);
  }
  if (trainer_of(ids[0], 0, &node) > 0) {
    restart_agent(node);
    ++events;
    failed(0, before);
  }
  at = checkpoint_after(at);
  ASSERT_EQ(events, 5) << cluster.DebugLogs();

  for (const std::string& id : ids) {
    ASSERT_TRUE(cluster.Cancel(id).ok());
    v1::JobInfo info;
    ASSERT_TRUE(cluster.WaitJob(
        id, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 60000, &info))
        << cluster.DebugLogs();
    EXPECT_GE(info.job().attempt(), 3) << id;
    std::cout << id << ": " << info.job().attempt() << " attempts, " << info.job().restarts()
              << " restarts\n";
  }

  // Uninterrupted runs of the same specs, same mesh, to the step of each job's newest
  // checkpoint (the final step always checkpoints).
  for (const auto& [name, parallel] : std::vector<std::pair<std::string, std::string>>{
           {"zero", zero_parallel}, {"pipe", pipe_parallel}}) {
    const auto saved = engine::ckpt::ListCheckpoints((dir_ / name / "ckpt").string());
    ASSERT_FALSE(saved.empty()) << name;
    const auto [step, path] = saved.front();
    ASSERT_GT(step, 40) << name;  // five events, each after a new checkpoint
    const std::string ref_name = "ref-" + name;
    std::ofstream(dir_ / (ref_name + ".yaml")) << Yaml(ref_name, parallel, step);
    const pid_t p = Spawn({kBin + "drover", "train", (dir_ / (ref_name + ".yaml")).string(),
                           "--threads", "1", "--nproc", "2"});
    ASSERT_EQ(Wait(p), 0) << Log();
    auto want = engine::ckpt::VerifyCheckpoint(
        (dir_ / ref_name / "ckpt" / engine::ckpt::StepDirName(step)).string(), step);
    auto got = engine::ckpt::VerifyCheckpoint(path, step);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    for (const auto& [arena, w, g] :
         std::vector<std::tuple<std::string, const std::vector<float>*, const std::vector<float>*>>{
             {"weights", &want->params, &got->params},
             {"adam_m", &want->adam_m, &got->adam_m},
             {"adam_v", &want->adam_v, &got->adam_v}}) {
      ASSERT_GT(w->size(), 0u);
      ASSERT_EQ(g->size(), w->size()) << name << " " << arena;
      size_t differ = 0;
      for (size_t i = 0; i < w->size(); ++i) differ += std::memcmp(&(*g)[i], &(*w)[i], 4) != 0;
      EXPECT_EQ(differ, 0u) << name << " at step " << step << ": " << differ << " of " << w->size()
                            << " elements of " << arena << " differ from the uninterrupted run";
    }
  }
}

}  // namespace
}  // namespace drover
