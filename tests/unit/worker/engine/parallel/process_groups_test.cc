#include "worker/engine/parallel/process_groups.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/unit/worker/engine/parallel/fake_group.h"

namespace drover::engine::parallel {
namespace {

// A group whose Sync returns `sync`.
class NamedGroup final : public testing::FakeGroup {
 public:
  NamedGroup(std::string name, int size, Status sync)
      : FakeGroup(std::move(name), size), sync_(std::move(sync)) {}
  Status Sync() override { return sync_; }

 private:
  const Status sync_;
};

JobSpec Spec(int dp, int pp, int tp) {
  JobSpec s;
  s.model.n_layer = 4;
  s.model.n_head = 4;
  s.model.n_embd = 32;
  s.parallel.dp = dp;
  s.parallel.pp = pp;
  s.parallel.tp = tp;
  s.train.global_batch = 4 * dp;
  s.train.micro_batch = 1;
  return s;
}

// Only the dp group's calls are made on its CommStream (data_parallel.h), which needs them
// complete at their return; a backend may let the training thread's run in stream order.
TEST(ProcessGroupsTest, OnlyTheDpGroupIsCalledFromTheCommStream) {
  auto mesh = ParallelMesh::Create(Spec(2, 2, 2), 8);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::map<std::string, GroupCaller> callers;
  auto groups = ConnectProcessGroups(
      *mesh, 0,
      [&](const std::string& name, int, int size,
          GroupCaller caller) -> StatusOr<std::unique_ptr<Communicator>> {
        callers[name.substr(0, name.find('.'))] = caller;
        return std::unique_ptr<Communicator>(new NamedGroup(name, size, OkStatus()));
      });
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(callers.size(), 6u);  // world, dp, pp, ppgrad, tp, emb
  for (const auto& [group, caller] : callers) {
    EXPECT_EQ(caller == GroupCaller::kCommStream, group == "dp") << group;
  }
}

// Hybrid sharding: rank 5 of dp4 x tp2 (tp 1 of dp 2) joins its shard group (dp 2, 3: ranks 5
// and 7) and its replica group (dp 0, 2: ranks 1 and 5), each named so that no other
// group of the mesh has its name, and both called from the dp CommStream.
TEST(ProcessGroupsTest, HybridShardingJoinsAShardAndAReplicaGroupBothFromTheCommStream) {
  JobSpec spec = Spec(4, 1, 2);
  spec.parallel.zero_stage = 3;
  spec.parallel.dp_shard = 2;
  auto mesh = ParallelMesh::Create(spec, 8);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  std::map<std::string, std::pair<int, GroupCaller>> joined;  // name: (rank in it, caller)
  auto groups = ConnectProcessGroups(
      *mesh, 5,
      [&](const std::string& name, int rank, int size,
          GroupCaller caller) -> StatusOr<std::unique_ptr<Communicator>> {
        joined[name] = {rank, caller};
        return std::unique_ptr<Communicator>(new NamedGroup(name, size, OkStatus()));
      });
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(joined.count("dp.pp0.tp1.r1"), 1u);
  EXPECT_EQ(joined["dp.pp0.tp1.r1"], std::make_pair(0, GroupCaller::kCommStream));
  ASSERT_EQ(joined.count("dprep.pp0.tp1.s0"), 1u);
  EXPECT_EQ(joined["dprep.pp0.tp1.s0"], std::make_pair(1, GroupCaller::kCommStream));
  EXPECT_EQ(groups->dp->size(), 2);
  EXPECT_EQ(groups->dp_replica->size(), 2);
}

TEST(ProcessGroupsTest, SyncAllReturnsTheFirstGroupsFailure) {
  auto mesh = ParallelMesh::Create(Spec(1, 1, 2), 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto groups = ConnectProcessGroups(
      *mesh, 0,
      [&](const std::string& name, int, int size,
          GroupCaller) -> StatusOr<std::unique_ptr<Communicator>> {
        Status sync = name.rfind("tp", 0) == 0
                          ? DeadlineExceededError("nccl group \"" + name + "\": aborted")
                          : OkStatus();
        return std::unique_ptr<Communicator>(new NamedGroup(name, size, sync));
      });
  ASSERT_TRUE(groups.ok()) << groups.status();
  Status synced = SyncAll(*groups);
  EXPECT_EQ(synced.code(), StatusCode::kDeadlineExceeded) << synced;
  EXPECT_NE(synced.message().find("tp."), std::string::npos) << synced;
  groups->tp.reset();
  EXPECT_TRUE(SyncAll(*groups).ok());
}

}  // namespace
}  // namespace drover::engine::parallel
