// How jobs of the real trainer fail under the coordinator: input the user must fix fails
// the job at once (no restart loop), and the failure reason carries the trainer's own
// message, so `drover status` says what is wrong without `drover logs`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/integration/cluster.h"

namespace drover::testing {
namespace {

using ::testing::HasSubstr;

TEST(JobFailureTest, MissingDataFailsTheJobAtOnceWithTheTrainersMessage) {
  ClusterOptions o;
  o.agents = 1;
  o.trainer = "drover-trainer";
  o.name = "missing_data";
  Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  const std::string yaml = "name: nodata\noutput_dir: " + (cluster.root() / "out").string() +
                           "\nmodel: {n_layer: 1, n_head: 1, n_embd: 8, block_size: 8, "
                           "vocab_size: 16}\n"
                           "data: {train: " +
                           (cluster.root() / "nowhere_*.bin").string() +
                           "}\n"
                           "train: {steps: 5, global_batch: 2, micro_batch: 2, seq_len: 8}\n"
                           "fault_tolerance: {max_restarts: 10}\n";
  auto id = cluster.Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobInfo info;
  ASSERT_TRUE(cluster.WaitJob(
      *id, [](const v1::JobInfo& i) { return i.job().state() == v1::FAILED; }, 20000, &info))
      << info.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(info.job().restarts(), 0);
  EXPECT_EQ(info.attempts_size(), 1);
  EXPECT_THAT(info.job().reason(), HasSubstr("exited with code 2"));
  EXPECT_THAT(info.job().reason(), HasSubstr("data.train: no token shard matches"));
  EXPECT_THAT(info.job().reason(), HasSubstr("not restarted"));
}

}  // namespace
}  // namespace drover::testing
