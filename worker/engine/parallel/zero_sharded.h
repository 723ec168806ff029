// ZeRO stages 2 and 3 (see training_memory.h for the table of stages): no rank ever holds
// the whole gradient, and under stage 3 not the whole parameters either.
//
// Gradients: backward writes each unit's gradient into a transient buffer from a pool;
// when the unit is ready the CommStream reduce-scatters it over dp (average) and adds this
// rank's slice into its owned gradient shard, then the buffer goes back to the pool. This
// happens every micro-batch (accumulation happens in the shard). At most
// kMaxGradsInFlight units wait for reduction at a time; backward blocks rather than
// allocating more.
//
// Parameters (stage 3): each rank keeps only its shard. Acquiring a unit gathers it into a
// pooled buffer (its own slice copied in, then an all-gather over dp); the stage's
// PrefetchParams hint starts the next unit's gather on the stream while the current unit
// computes. The buffer returns to the pool when the last acquisition is released.
// Stage 2 keeps whole parameters and all-gathers the updated shards after the optimizer.
//
// Hybrid sharding (parallel.dp_shard; FSDP's HYBRID_SHARD): `dp` is then one shard group of
// the dp ranks, and `replica` joins this rank with those holding the same shard in the other
// groups. Everything above runs inside the shard group, so the per-micro-batch gathers and
// reduce-scatters stay among its ranks (one node, where the gang scheduler packs them); the
// replicas average their accumulated gradient shards once a step, unit by unit on the
// step's last micro-batch, right after the unit's reduce-scatter (so that the traffic
// between nodes overlaps the rest of backward), and then take the same optimizer step on
// the same shard. The tied embedding's unit, whose rows of the last micro-batch arrive after
// its reduce-scatter on host memory (AddEmbeddingGrads), is averaged after them. The
// gradient the optimizer sees is the mean over every dp rank, as without it: the
// reduce-scatter averages over the group, the all-reduce over the replicas.
//
// Every dp collective runs on the stream in the order the training thread asked for it;
// that order depends only on the (identical) call sequence, so every dp rank issues the
// same collectives in the same order.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/parallel/comm_stream.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/training_memory.h"

namespace drover::engine::parallel {

class ShardedMemory final : public TrainingMemory {
 public:
  static constexpr int kMaxGradsInFlight = 4;

  // zero_stage is 2 or 3; dp is not null; replica is null unless sharding is hybrid. Not
  // owned: all pointers must outlive the memory.
  ShardedMemory(const GptLayout* layout, Ops* ops, Communicator* dp, Communicator* replica,
                int zero_stage);
  ~ShardedMemory() override;

  StatusOr<const float*> AcquireParams(int unit) override;
  Status ReleaseParams(int unit) override;
  void PrefetchParams(int unit) override;
  StatusOr<float*> AcquireGrads(int unit, bool* accumulate) override;
  Status GradsReady(int unit) override;
  Status AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout, int B,
                           int T) override;
  bool TiedUnitReadyAfterHead() const override { return tied_ready_after_head_; }

  void BeginStep() override;
  // Every micro-batch is reduced; the last one's reductions are also averaged over the
  // replicas under hybrid sharding.
  void SetLastMicroBatch(bool last) override { last_micro_batch_ = last; }
  Status FinishGradients(const std::function<Status(float* grads)>& sync_deferred) override;

  size_t owned_begin() const override { return partition_.begin(dp_->rank()); }
  size_t owned_end() const override { return partition_.end(dp_->rank()); }
  float* owned_params() override;
  float* owned_grads() override { return owned_grads_.data(); }
  int owned_replica() const override { return replica_ != nullptr ? replica_->rank() : 0; }
  bool params_sharded() const override { return zero_stage_ == 3; }
  size_t share_begin() const override;
  size_t share_end() const override;
  Status GatherShares(float* whole) override;
  Status PublishParams() override;

  Status ExportParams(float* local) override;
  void ImportParams(const float* local) override;
  Status GatherOwned(float* whole) override;

  MemoryUsage memory_usage() const override {
    return {params_.size(), owned_grads_.size(), pool_.high_water()};
  }
  double comm_busy_seconds() const override { return stream_.busy_seconds(); }
  double comm_blocked_seconds() const override { return stream_.blocked_seconds(); }
  double comm_overlapped_waits_seconds() const override {
    return stream_.overlapped_waits_seconds();
  }

 private:
  // Free transient buffers by size; buffers come back from the stream thread.
  class Pool {
   public:
    explicit Pool(Ops* ops) : ops_(ops) {}
    // A free buffer of exactly n floats, or null.
    std::shared_ptr<Buffer> TakeFree(size_t n);
    // A new one (counted in high_water).
    std::shared_ptr<Buffer> Allocate(size_t n);
    void Give(std::shared_ptr<Buffer> b);
    size_t high_water() const;

   private:
    Ops* ops_;
    mutable Mutex mu_;
    std::vector<std::shared_ptr<Buffer>> free_ GUARDED_BY(mu_);
    size_t held_ GUARDED_BY(mu_) = 0;  // floats allocated
    size_t high_water_ GUARDED_BY(mu_) = 0;
  };

  struct ParamSlot {
    std::shared_ptr<Buffer> buffer;
    int refs = 0;
    CommStream::Ticket ready = 0;
  };

  // A transient buffer of n floats for the training thread. After the first step the pool
  // holds as many of each size as the training thread ever holds at once (the same call
  // sequence every step), so a miss means the buffer is still on its way back from a
  // reduction: it waits for the oldest one rather than allocate (a device allocation
  // synchronises the GPU: Ops::device_allocations). It allocates during the first step, and
  // when no reduction is in flight.
  StatusOr<std::shared_ptr<Buffer>> TakeBuffer(size_t n);
  // Starts gathering unit u's parameters unless they are resident or on their way.
  Status StartGather(int unit);
  // On the stream's thread: averages n owned gradients at `own` over the replicas when this
  // is the step's last micro-batch under hybrid sharding (`last`, as it was when queued).
  Status AverageOverReplicas(float* own, size_t n, bool last);
  size_t owned_offset(size_t arena_offset) const { return arena_offset - owned_begin(); }

  const GptLayout* layout_;
  Ops* ops_;
  Communicator* dp_;       // the shard group
  Communicator* replica_;  // the replicas of this rank's shard; null without hybrid sharding
  const int zero_stage_;
  const bool tied_ready_after_head_;
  // Whether dp's collectives follow marks (Communicator::MarkCompute; NCCL): StartGather then
  // copies the rank's shard on the training thread and hands the gather a mark taken after
  // it, so that a prefetch waits on the GPU for that copy alone, not for the layers the host
  // enqueued before the stream's thread got to it. Elsewhere the stream's thread copies.
  const bool marks_;
  ShardPartition partition_;
  // The owned range split over the replicas: each one's share (share_begin).
  ReplicaShares shares_;
  Buffer params_;        // stage 2: the whole arena; stage 3: this rank's shard
  Buffer owned_grads_;   // this rank's shard of the dp-averaged gradient
  Buffer rows_scratch_;  // AddEmbeddingRows' device copy; used on the comm thread only
  Pool pool_;
  std::vector<ParamSlot> param_slots_;               // stage 3, per unit
  std::vector<std::shared_ptr<Buffer>> grad_slots_;  // per unit, while acquired
  std::deque<CommStream::Ticket> grads_in_flight_;
  bool warm_ = false;  // a step has finished (TakeBuffer)
  bool last_micro_batch_ = true;
  CommStream stream_;  // last: its thread stops before the buffers go
};

}  // namespace drover::engine::parallel
