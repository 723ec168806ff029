// The device mesh of one attempt of a job: dp x pp x tp = world_size, validated once from
// the job spec and a concrete world size (torchtitan's ParallelDims). The scheduler asks it
// which world sizes a spec admits (JobSpec::ValidateForWorldSize delegates here), and every
// trainer derives its coordinates and its groups from it, so the two can never disagree.
//
// Rank order, Megatron's: tp fastest, then dp, then pp:
//   rank = (pp_rank * dp + dp_rank) * tp + tp_rank,
// so a tensor-parallel group is a block of consecutive ranks (on one node, where the gang
// scheduler packs a job's ranks) and world rank 0 is the first stage's dp 0 / tp 0.
//
// Thread-safety: an immutable value.
#pragma once

#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"

namespace drover {

class ParallelMesh {
 public:
  struct Coord {
    int dp = 0;
    int pp = 0;
    int tp = 0;
    friend bool operator==(const Coord&, const Coord&) = default;
  };

  // The mesh of `spec` at `world_size`. InvalidArgument naming every factor and the rule
  // broken: world_size < 1; dp x pp x tp != world_size (or world_size not divisible by
  // pp x tp when dp is auto); n_layer not split by pp or parallel.pp_layers (StageLayers);
  // n_head not divisible by tp;
  // global_batch not divisible by dp x micro_batch; ZeRO-2/3 with pp > 1; under the
  // interleaved schedule, micro-batches per step not a multiple of pp; dp not divisible by
  // parallel.dp_shard.
  static StatusOr<ParallelMesh> Create(const JobSpec& spec, int world_size);

  int world_size() const { return dp_ * pp_ * tp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int tp() const { return tp_; }
  int zero_stage() const { return zero_stage_; }
  // ZeRO's sharding group: dp_shard() consecutive dp ranks (all dp ranks unless
  // parallel.dp_shard says fewer), and dp_replicas() = dp / dp_shard such groups holding the
  // same shards (hybrid sharding; 1 otherwise). dp rank d is member d % dp_shard of shard
  // group d / dp_shard.
  int dp_shard() const { return dp_shard_; }
  int dp_replicas() const { return dp_ / dp_shard_; }
  // Micro-batches each dp rank runs per optimizer step: global_batch / (dp x micro_batch)
  // (gradient accumulation steps; the pipeline's micro-batches in flight when pp > 1).
  int micro_batches() const { return micro_batches_; }
  // Model chunks per pipeline stage: 1, or parallel.pp_chunks (2 by default) under the
  // interleaved schedule, virtual stage c x pp + s being chunk c of stage s.
  int pp_chunks() const { return pp_chunks_; }

  Coord CoordOf(int rank) const;
  int RankOf(const Coord& c) const { return (c.pp * dp_ + c.dp) * tp_ + c.tp; }

  // World ranks (ascending) of the group along one axis through `rank`.
  std::vector<int> DpGroup(int rank) const;
  // The dp ranks of `rank`'s shard group, and those holding the same shard as it in the
  // other replicas (one rank, itself, without hybrid sharding).
  std::vector<int> DpShardGroup(int rank) const;
  std::vector<int> DpReplicaGroup(int rank) const;
  std::vector<int> PpGroup(int rank) const;
  std::vector<int> TpGroup(int rank) const;

  // parallel.pp_layers as the spec gives it: each (virtual) stage's layer count, or empty
  // for the even split (StageLayers resolves it against the model's n_layer).
  const std::vector<int>& pp_layers() const { return pp_layers_; }

  // "dp2 x pp2 x tp1, ZeRO-1, 1f1b, 4 micro-batches per step" (+ ", layers 7+5" when
  // parallel.pp_layers is given; "interleaved x2" for two chunks per stage; "ZeRO-3 in 2
  // replicas of dp4" under hybrid sharding)
  std::string Describe() const;

 private:
  int dp_ = 1, pp_ = 1, tp_ = 1;
  int zero_stage_ = 0;
  int dp_shard_ = 1;
  int micro_batches_ = 1;
  int pp_chunks_ = 1;
  std::string pp_schedule_;
  std::vector<int> pp_layers_;
};

// The layers of each of `pp` pipeline stages of an n_layer model, or with `chunks` per stage
// (the interleaved schedule) of each of pp x chunks virtual stages: pp_layers when given
// (one entry per (virtual) stage, each at least 1, adding up to n_layer), else an even
// split (which must divide n_layer). InvalidArgument names the rule broken.
StatusOr<std::vector<int>> StageLayers(int n_layer, int pp, const std::vector<int>& pp_layers,
                                       int chunks = 1);

}  // namespace drover
