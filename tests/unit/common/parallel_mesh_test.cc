// The device mesh: coordinates and groups, and a table of impossible layouts with the
// message each one gets.
#include "common/parallel_mesh.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace drover {
namespace {

JobSpec Spec(int layers, int heads, int pp, int tp, int dp, int global, int micro, int zero) {
  JobSpec s;
  s.model.n_layer = layers;
  s.model.n_head = heads;
  s.model.n_embd = heads * 8;
  s.parallel.pp = pp;
  s.parallel.tp = tp;
  s.parallel.dp = dp;
  s.train.global_batch = global;
  s.train.micro_batch = micro;
  s.parallel.zero_stage = zero;
  return s;
}

TEST(ParallelMeshTest, RanksRunTensorFastestThenDataThenPipeline) {
  auto mesh = ParallelMesh::Create(Spec(4, 4, 2, 2, 0, 8, 2, 1), 8);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->dp(), 2);
  EXPECT_EQ(mesh->micro_batches(), 2);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(mesh->RankOf(mesh->CoordOf(r)), r);
  EXPECT_EQ(mesh->CoordOf(5), (ParallelMesh::Coord{0, 1, 1}));  // dp 0, pp 1, tp 1
  EXPECT_EQ(mesh->TpGroup(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(mesh->DpGroup(5), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh->PpGroup(5), (std::vector<int>{1, 5}));
  EXPECT_EQ(mesh->Describe(), "dp2 x pp2 x tp2, ZeRO-1, 1f1b, 2 micro-batches per step");
}

TEST(ParallelMeshTest, StageLayersAreEvenOrAsListed) {
  EXPECT_EQ(*StageLayers(12, 3, {}), (std::vector<int>{4, 4, 4}));
  EXPECT_EQ(*StageLayers(12, 2, {7, 5}), (std::vector<int>{7, 5}));
  EXPECT_EQ(StageLayers(12, 2, {7, 4}).status().message(),
            "parallel.pp_layers adds up to 11 layers, but model.n_layer is 12");
  EXPECT_EQ(StageLayers(12, 3, {7, 5}).status().message(),
            "parallel.pp_layers has 2 entries for pp (3); give one per stage");
  EXPECT_EQ(StageLayers(12, 2, {12, 0}).status().message(),
            "parallel.pp_layers has a stage of 0 layers; every stage needs at least 1");
  JobSpec spec = Spec(5, 4, 2, 1, 0, 8, 1, 0);  // 5 layers do not split evenly in two
  EXPECT_FALSE(ParallelMesh::Create(spec, 2).ok());
  spec.parallel.pp_layers = {3, 2};
  auto mesh = ParallelMesh::Create(spec, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->pp_layers(), (std::vector<int>{3, 2}));
  EXPECT_EQ(mesh->Describe(), "dp1 x pp2 x tp1, 1f1b, layers 3+2, 8 micro-batches per step");
}

// Two chunks per stage by default under the interleaved schedule (virtual stages of
// n_layer / (pp x chunks) layers each); pp_layers then counts the virtual stages.
TEST(ParallelMeshTest, TheInterleavedScheduleRunsChunksOfVirtualStages) {
  JobSpec spec = Spec(8, 4, 2, 1, 0, 8, 1, 0);
  spec.parallel.pp_schedule = "interleaved";
  auto mesh = ParallelMesh::Create(spec, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->pp_chunks(), 2);
  EXPECT_EQ(mesh->Describe(), "dp1 x pp2 x tp1, interleaved x2, 8 micro-batches per step");
  spec.parallel.pp_chunks = 4;
  ASSERT_TRUE(ParallelMesh::Create(spec, 2).ok());
  spec.parallel.pp_layers = {2, 2, 1, 1, 1, 1};  // 6 entries for 8 virtual stages
  EXPECT_EQ(ParallelMesh::Create(spec, 2).status().message(),
            "parallel.pp_layers has 6 entries for pp (2) x parallel.pp_chunks (4) = 8 virtual "
            "stages; give one per virtual stage");
  spec.parallel.pp_layers = {};
  spec.parallel.pp_chunks = 3;
  EXPECT_EQ(ParallelMesh::Create(spec, 2).status().message(),
            "model.n_layer (8) is not divisible by pp (2) x parallel.pp_chunks (3) = 6 virtual "
            "stages; give parallel.pp_layers for an uneven split");
  EXPECT_EQ(ParallelMesh::Create(Spec(8, 4, 2, 1, 0, 8, 1, 0), 2)->pp_chunks(), 1);
}

JobSpec Interleaved(JobSpec s) {
  s.parallel.pp_schedule = "interleaved";
  return s;
}

struct Impossible {
  JobSpec spec;
  int world;
  std::string message;
};

JobSpec HybridSharded(JobSpec s, int dp_shard) {
  s.parallel.dp_shard = dp_shard;
  return s;
}

// parallel.dp_shard: shard groups of consecutive dp ranks (on one node, as the gang
// scheduler packs a job), replica groups across them; without it one group of every dp rank.
TEST(ParallelMeshTest, HybridShardingGroupsConsecutiveDpRanksAndReplicatesAcrossThem) {
  auto mesh = ParallelMesh::Create(HybridSharded(Spec(4, 4, 1, 2, 0, 12, 1, 3), 2), 12);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_EQ(mesh->dp(), 6);
  EXPECT_EQ(mesh->dp_shard(), 2);
  EXPECT_EQ(mesh->dp_replicas(), 3);
  // Rank 7: tp 1 of dp 3, the second member of shard group 1 (dp 2, 3).
  EXPECT_EQ(mesh->DpShardGroup(7), (std::vector<int>{5, 7}));
  EXPECT_EQ(mesh->DpReplicaGroup(7), (std::vector<int>{3, 7, 11}));
  EXPECT_EQ(mesh->DpGroup(7), (std::vector<int>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(mesh->Describe(),
            "dp6 x pp1 x tp2, ZeRO-3 in 3 replicas of dp2, 2 micro-batches per step");
  auto plain = ParallelMesh::Create(Spec(4, 4, 1, 2, 0, 12, 1, 3), 12);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->dp_replicas(), 1);
  EXPECT_EQ(plain->DpShardGroup(7), plain->DpGroup(7));
  EXPECT_EQ(plain->DpReplicaGroup(7), (std::vector<int>{7}));
}

TEST(ParallelMeshTest, ImpossibleLayoutsNameEveryFactor) {
  const std::vector<Impossible> table = {
      {Spec(4, 4, 1, 1, 0, 8, 1, 0), 0, "world_size 0 must be at least 1"},
      {Spec(6, 4, 4, 1, 0, 8, 1, 0), 4,
       "model.n_layer (6) is not divisible by pp (4); give parallel.pp_layers for an uneven split"},
      {Spec(4, 6, 1, 4, 0, 8, 1, 0), 4, "model.n_head (6) is not divisible by tp (4)"},
      {Spec(4, 4, 2, 2, 0, 8, 1, 0), 6, "world_size 6 is not divisible by pp (2) x tp (2) = 4"},
      {Spec(4, 4, 2, 1, 3, 12, 1, 0), 4,
       "dp (3) x pp (2) x tp (1) = 6 does not equal world_size 4; set parallel.dp to auto or "
       "to 4 / (pp x tp)"},
      {Spec(4, 4, 1, 1, 0, 12, 4, 0), 2,
       "train.global_batch (12) is not divisible by dp (2) x train.micro_batch (4) = 8 at "
       "world_size 2"},
      {Spec(4, 4, 2, 1, 0, 8, 1, 2), 4,
       "parallel.zero_stage 2 with pp (2) > 1: ZeRO-2/3 would reduce-scatter every stage's "
       "gradients once per micro-batch; use zero_stage 0 or 1 with pipelines"},
      {Interleaved(Spec(4, 4, 2, 1, 0, 6, 2, 0)), 2,
       "the interleaved schedule needs the micro-batches per step, train.global_batch (6) / "
       "(dp (1) x train.micro_batch (2)) = 3 at world_size 2, to be a multiple of pp (2)"},
      {Interleaved(Spec(4, 4, 1, 1, 0, 8, 1, 0)), 1,
       "parallel.pp_schedule interleaved needs pp (1) of at least 2"},
      {HybridSharded(Spec(4, 4, 1, 2, 0, 12, 1, 3), 4), 6,
       "dp (3) at world_size 6 is not divisible by parallel.dp_shard (4): hybrid sharding needs "
       "whole replicas of dp_shard ranks"},
  };
  for (const Impossible& c : table) {
    auto mesh = ParallelMesh::Create(c.spec, c.world);
    ASSERT_FALSE(mesh.ok()) << c.message;
    EXPECT_EQ(mesh.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(mesh.status().message(), c.message);
  }
}

}  // namespace
}  // namespace drover
