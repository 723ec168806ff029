// Split brain: an agent cut off from the coordinator while its trainer keeps running (here
// the agent is stopped with SIGSTOP: its heartbeats cease, its trainer runs on until its
// output pipe fills, and again once the agent is continued). The
// coordinator declares the node dead and starts the next attempt elsewhere; the old
// trainer's lease on its attempt lapses first, so it stops publishing before the new
// attempt can start, and exits when the coordinator tells it the attempt is superseded.
// Both attempts never write one metrics.jsonl or one checkpoint directory at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "common/token_shard.h"
#include "tests/integration/cluster.h"

namespace drover::testing {
namespace {

TEST(SplitBrainTest, ASupersededAttemptStopsPublishingAndExits) {
  ClusterOptions o;
  o.agents = 2;
  o.trainer = "drover-trainer";
  o.name = "split_brain";
  Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  const auto data = cluster.root() / "train.bin";
  std::mt19937_64 rng(9);
  std::vector<uint16_t> tokens(50000);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 32);
  ASSERT_TRUE(WriteTokenShard(data.string(), tokens).ok());
  const auto out = cluster.root() / "out";
  const std::string yaml = "name: split\noutput_dir: " + out.string() +
                           "\nmodel: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, "
                           "vocab_size: 32}\n"
                           "data: {train: " +
                           data.string() +
                           "}\n"
                           "train: {steps: 100000, global_batch: 4, micro_batch: 4, seq_len: 16, "
                           "eval_every: 0}\n"
                           "checkpoint: {every_steps: 50, keep_last: 2}\n"
                           "resources: {world_size: {min: 1, max: 1}, threads_per_rank: 1}\n"
                           "fault_tolerance: {max_restarts: 5}\n";
  auto id = cluster.Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobInfo info;
  ASSERT_TRUE(cluster.WaitJob(
      *id,
      [](const v1::JobInfo& i) {
        return !i.trainers().empty() && i.trainers(0).progress().last_checkpoint_step() >= 50;
      },
      30000, &info))
      << cluster.DebugLogs();
  const std::string node = info.job().placement(0).node();
  const pid_t old_trainer = info.trainers(0).pid();
  cluster.agent(node)->Kill(SIGSTOP);

  // The next attempt runs elsewhere and checkpoints; the old trainer is gone by then.
  ASSERT_TRUE(cluster.WaitJob(
      *id,
      [](const v1::JobInfo& i) {
        if (i.job().attempt() < 2) return false;
        for (const auto& t : i.trainers()) {
          if (t.attempt() == i.job().attempt() && t.progress().step() > 0 &&
              t.progress().last_checkpoint_step() > i.attempts().rbegin()->resume_step()) {
            return true;
          }
        }
        return false;
      },
      30000, &info))
      << cluster.DebugLogs();
  // Every trainer the job has had; CANCELLED clears the job's ranks, so a later JobInfo may
  // no longer name the attempt-2 trainer that is still on its way out.
  std::vector<pid_t> trainers = {old_trainer};
  for (const auto& t : info.trainers()) trainers.push_back(t.pid());
  // The stopped agent no longer drains its trainer's output, so the old trainer soon blocks
  // writing its log; let it go on, then it must find itself superseded and exit.
  cluster.agent(node)->Kill(SIGCONT);
  EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(old_trainer); }, 10000, 10))
      << "the superseded trainer still runs";
  ASSERT_TRUE(cluster.Cancel(*id).ok());
  const auto old_log = cluster.root() / node / "logs" / *id / "attempt-1" / "rank-0.log";
  EXPECT_TRUE(WaitUntil(
      [&] {
        return ReadAll(old_log.string()).find("this attempt is superseded") != std::string::npos;
      },
      5000, 20))
      << ReadAll(old_log.string()).substr(0, 2000);

  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 30000, &info))
      << cluster.DebugLogs();
  // CANCELLED is recorded when the stop is ordered; a trainer on its way out may still append
  // a metrics line or commit and prune a checkpoint. Read the files once every trainer the
  // job had is gone.
  for (const auto& t : info.trainers()) trainers.push_back(t.pid());
  for (const pid_t pid : trainers) {
    EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(pid); }, 10000, 10))
        << "trainer " << pid << " still runs";
  }

  // metrics.jsonl: attempt 1's lines, then only the newer attempts' (never interleaved).
  std::ifstream in(out / "metrics.jsonl");
  int64_t newest = 0, switches = 0;
  for (std::string l; std::getline(in, l);) {
    // The last line may still be being written by a trainer on its way out.
    if (l.empty() || l.back() != '}') continue;
    const size_t at = l.find("\"attempt\":");
    if (at == std::string::npos) {
      ADD_FAILURE() << "a metrics line without its attempt: " << l;
      continue;
    }
    const int64_t attempt = std::stoll(l.substr(at + 10));
    if (attempt < newest)
      ADD_FAILURE() << "an attempt-" << attempt << " line after attempt " << newest << ": " << l;
    if (attempt > newest) ++switches;
    newest = std::max(newest, attempt);
  }
  EXPECT_GE(newest, 2);
  EXPECT_LE(switches, 3);
  // Every complete checkpoint is whole (one attempt's shards under its manifest).
  for (const auto& e : std::filesystem::directory_iterator(out / "ckpt")) {
    if (e.path().extension() == ".tmp") continue;
    EXPECT_TRUE(std::filesystem::exists(e.path() / "manifest.json")) << e.path();
  }
}

}  // namespace
}  // namespace drover::testing
