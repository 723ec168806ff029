// Data parallelism with whole gradients: ZeRO stage 0 (plain DDP) and stage 1 (optimizer
// state sharded). See training_memory.h for the table of stages.
//
// Gradients live in one arena, as in single-process training. On the step's last
// micro-batch, each bucket (PlanBuckets: units in the order backward finishes them) is
// handed to the CommStream the moment its last unit is ready: stage 0 all-reduces it
// (average), stage 1 reduce-scatters it so each rank ends up with the average of its own
// shard only. Earlier micro-batches just accumulate locally (no_sync in PyTorch's terms).
// Stage 1 then all-gathers the updated shards (PublishParams). On a single stage the tied
// embedding is a bucket of its own, reduced right after the LM head's backward; the
// embedding's rows of the last micro-batch follow it (AddEmbeddingGrads), gathered from
// every dp rank and added after the reduction, in stream order (on host memory; on a device
// the unit is made ready after the embedding's backward instead: TiedUnitReadyAfterHeadOn).
//
// Hybrid sharding at stage 1 (parallel.dp_shard; zero_sharded.h says what it is): `dp` is
// the rank's shard group and `replica` the ranks holding the same shard in the others. A
// bucket is reduce-scattered in the group and this rank's part of it averaged over the
// replicas right after (the tied unit's after its rows), and the updated shards are
// gathered in the group.
//
// With a null dp communicator (dp = 1) nothing is reduced and the memory is exactly
// FlatStageMemory: single-process training goes through here unchanged.
#pragma once

#include <memory>
#include <vector>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/parallel/comm_stream.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/training_memory.h"

namespace drover::engine::parallel {

class DataParallelMemory final : public TrainingMemory {
 public:
  // `dp` may be null (dp = 1); zero_stage is 0 or 1. `deferred` units are left out of the
  // buckets and reduced in FinishGradients after its sync_deferred hook. `replica` is null
  // unless sharding is hybrid (stage 1 only). Not owned: all pointers must outlive the
  // memory.
  DataParallelMemory(const GptLayout* layout, Ops* ops, Communicator* dp, int zero_stage,
                     size_t bucket_floats, std::vector<int> deferred,
                     Communicator* replica = nullptr);
  ~DataParallelMemory() override;

  StatusOr<const float*> AcquireParams(int unit) override { return flat_.AcquireParams(unit); }
  Status ReleaseParams(int unit) override { return flat_.ReleaseParams(unit); }
  StatusOr<float*> AcquireGrads(int unit, bool* accumulate) override {
    return flat_.AcquireGrads(unit, accumulate);
  }
  Status GradsReady(int unit) override;
  Status AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout, int B,
                           int T) override;
  bool TiedUnitReadyAfterHead() const override { return tied_ready_after_head_; }

  void BeginStep() override;
  void SetLastMicroBatch(bool last) override { last_micro_batch_ = last; }
  Status FinishGradients(const std::function<Status(float* grads)>& sync_deferred) override;

  size_t owned_begin() const override;
  size_t owned_end() const override;
  float* owned_params() override { return params_.data() + owned_begin(); }
  float* owned_grads() override { return grads_.data() + owned_begin(); }
  int owned_replica() const override;
  bool params_sharded() const override { return false; }
  size_t share_begin() const override;
  size_t share_end() const override;
  Status GatherShares(float* whole) override;
  Status PublishParams() override;

  Status ExportParams(float* local) override;
  void ImportParams(const float* local) override;
  Status GatherOwned(float* whole) override;

  MemoryUsage memory_usage() const override { return {params_.size(), grads_.size(), 0}; }
  double comm_busy_seconds() const override;
  double comm_blocked_seconds() const override;
  double comm_overlapped_waits_seconds() const override;

  // The whole arenas (for tests).
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

 private:
  // Queues the reduction of [begin, end) of the gradient arena, and under hybrid sharding
  // the average of this rank's part of it over the replicas unless `rows_follow` (the tied
  // unit's rows come after: AddEmbeddingGrads averages it then).
  void Reduce(size_t begin, size_t end, bool rows_follow = false);
  // On the stream's thread: averages grads [lo, hi) over the replicas (hybrid sharding).
  Status AverageOverReplicas(size_t lo, size_t hi);
  // Completes `whole` from every group member's partition_ range (an all-gather over dp).
  Status GatherPartition(float* whole);

  const GptLayout* layout_;
  Ops* ops_;
  Communicator* dp_;       // the shard group under hybrid sharding
  Communicator* replica_;  // null unless hybrid
  const int zero_stage_;
  const bool tied_ready_after_head_;
  Buffer params_;
  Buffer grads_;
  Buffer rows_scratch_;  // AddEmbeddingRows' device copy; used on the comm thread only
  FlatStageMemory flat_;
  ShardPartition partition_;
  ReplicaShares shares_;  // the owned range over the replicas (share_begin)
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;  // -1 for deferred units
  std::vector<int> deferred_;
  std::vector<int> pending_units_;  // per bucket: units not yet ready in this step
  bool last_micro_batch_ = true;
  std::unique_ptr<CommStream> stream_;  // null when dp is null
};

}  // namespace drover::engine::parallel
