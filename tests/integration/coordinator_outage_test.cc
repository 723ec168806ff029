// A real two-rank job through a coordinator outage longer than its collectives' deadline
// (parallel.timeout_s), checkpointing every other step: the trainers keep training while
// the coordinator is away (DESIGN.md "Durable state") and the attempt never fails.
//
// Every checkpoint's commit waits on the coordinator (rank 1's shard report goes through its
// rendezvous store, rank 0's commit through its lease), so during the outage the write in
// flight waits on it. Before, the next checkpoint, due a few steps later while that write
// was younger than checkpoint_defer_after, waited for it in the training thread; the ranks
// stopped at different steps, and the first to reach the next collective waited there past
// its deadline and failed the attempt.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/integration/cluster.h"
#include "tests/integration/train_process.h"

namespace drover {
namespace {

class CoordinatorOutageTest : public TrainProcessFixture {};

TEST_F(CoordinatorOutageTest, ARealJobTrainsThroughAnOutageLongerThanItsCollectiveDeadline) {
  testing::ClusterOptions o;
  o.agents = 2;
  o.trainer = "drover-trainer";
  o.name = "outage";
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  const std::string yaml =
      "name: outage\noutput_dir: " + (dir_ / "outage").string() +
      "\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
      "data: {train: " +
      (dir_ / "train.bin").string() +
      "}\ntrain: {steps: 1000000, global_batch: 4, micro_batch: 2, seq_len: 16, lr: 0.003, "
      "warmup_steps: 5, schedule: constant, eval_every: 0}\n"
      "parallel: {timeout_s: 3}\n"
      "checkpoint: {every_steps: 2, keep_last: 3}\n"
      "resources: {world_size: {min: 2, max: 2}, threads_per_rank: 1}\n"
      "fault_tolerance: {max_restarts: 5}\n";
  auto id = cluster.Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  const auto saved_after = [&](int64_t step, v1::JobInfo* info) {
    return cluster.WaitJob(
        *id,
        [&](const v1::JobInfo& i) {
          return i.job().state() == v1::FAILED ||
                 (i.job().state() == v1::RUNNING && i.job().latest_checkpoint_step() > step);
        },
        60000, info);
  };
  v1::JobInfo before;
  ASSERT_TRUE(saved_after(0, &before)) << before.job().reason() << cluster.DebugLogs();
  ASSERT_EQ(before.job().state(), v1::RUNNING) << before.job().reason();

  cluster.coordinator()->Kill(SIGKILL);
  std::this_thread::sleep_for(std::chrono::seconds(8));  // parallel.timeout_s is 3
  cluster.StartCoordinator();

  v1::JobInfo after;
  ASSERT_TRUE(saved_after(before.job().latest_checkpoint_step(), &after))
      << after.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(after.job().state(), v1::RUNNING) << after.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(after.job().attempt(), 1) << after.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(after.job().restarts(), 0);
  ASSERT_TRUE(cluster.Cancel(*id).ok());
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 60000, &after));
}

}  // namespace
}  // namespace drover
