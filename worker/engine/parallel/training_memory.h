// TrainingMemory: a StageMemory (model/stage_memory.h) that also owns the step-level life
// of the parameters, gradients and optimizer state of one rank under data parallelism and
// ZeRO (DeepSpeed's stages, over the dp group):
//
//   stage | parameters        | gradients                    | AdamW m, v | reduction
//   ------+-------------------+------------------------------+------------+----------------
//     0   | whole             | whole                        | whole      | all-reduce,
//         |                   |                              |            | per bucket
//     1   | whole             | whole, reduce-scattered      | shard      | reduce-scatter,
//         |                   | at the end                   |            | per bucket
//     2   | whole             | shard (+ transient unit      | shard      | reduce-scatter,
//         |                   | buffers)                     |            | per unit
//     3   | shard (gathered   | as stage 2                   | shard      | as stage 2
//         | per unit)         |                              |            |
//
// "whole" is the rank's local arena (its pipeline stage and tensor-parallel part); a shard
// is this dp rank's contiguous slice of it (ShardPartition). Stages 0/1 reduce on the last
// micro-batch of a step only, in buckets launched as backward makes their units ready;
// stages 2/3 reduce every micro-batch so that no whole gradient is ever held.
//
// One optimizer step, as the trainer drives it:
//   BeginStep(); for each micro-batch: SetLastMicroBatch(..), Forward, Backward;
//   FinishGradients();                        owned_grads() now hold the dp-averaged gradient
//   norm from OwnedGradSumSquares (+ all-reduce), clip with ScaleOwnedGrads,
//   AdamW over owned_params() / owned_grads(); PublishParams().
//
// Thread-safety: the training thread calls everything; reductions run on the memory's
// CommStream, which is the only user of the dp communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/model/stage_memory.h"
#include "worker/engine/parallel/comm_stream.h"
#include "worker/engine/parallel/communicator.h"

namespace drover::engine::parallel {

// Contiguous slices of [0, n) for `parts` ranks: rank r owns [r * S, (r + 1) * S) clipped
// to n, S = ceil(n / parts) rounded up to 16 floats (64 bytes) so shards start aligned.
struct ShardPartition {
  size_t n = 0;
  int parts = 1;
  size_t shard = 0;  // S

  ShardPartition(size_t n, int parts);
  size_t begin(int r) const;
  size_t end(int r) const;
  // counts[r] = |[lo, hi) ∩ shard r|: the per-rank chunks of a collective over [lo, hi).
  std::vector<size_t> Counts(size_t lo, size_t hi) const;
};

// Hybrid sharding's split of one rank's owned range [owned_begin, owned_end) among its
// replicas (the ranks of the other shard groups that own the same range): each replica's
// share, which is what a checkpoint writes of the range and a restore reads, and the
// all-gather over the replicas that rebuilds the range from the shares. Without replicas
// (`replica` null) the one share is the whole owned range.
class ReplicaShares {
 public:
  ReplicaShares(Communicator* replica, size_t owned_begin, size_t owned_end);
  // This rank's share, as elements of the local arena.
  size_t begin() const;
  size_t end() const;
  // Submits to `stream` (the one caller of `replica`) the all-gather that completes
  // whole[owned_begin, owned_end) (host memory) from every replica's share. Without
  // replicas, nothing.
  void SubmitGather(CommStream* stream, float* whole) const;

 private:
  Communicator* replica_;
  size_t owned_begin_;
  ShardPartition split_;
};

// Runs of consecutive units (in the order backward makes them ready, i.e. descending
// index) whose total reaches `bucket_floats`; `excluded` units get no bucket, `alone` units
// a bucket of their own (the embedding on a single stage, ready first, not last). Each
// bucket is a contiguous range of the arena. Pure, for tests.
struct Bucket {
  std::vector<int> units;
  size_t begin = 0, end = 0;
};
std::vector<Bucket> PlanBuckets(const std::vector<Unit>& units, size_t bucket_floats,
                                const std::vector<int>& excluded, const std::vector<int>& alone);

// The embedding's backward of one micro-batch as data that travels between dp ranks
// (StageMemory::AddEmbeddingGrads after the unit's reduction started): the B*T token ids as
// floats (exact below 2^24) followed by dout (B, T, C) times `scale` (1 / dp: the rows are
// averaged like the rest of the gradient). `dout` is `ops`' memory (read with ToHost); the
// result is host memory, which the communicators move as it is.
std::vector<float> PackEmbeddingRows(Ops* ops, const int32_t* inputs, const float* dout, int B,
                                     int T, int C, float scale);
// Adds one rank's packed rows (host memory) into the window [lo, hi) (elements of the
// embedding unit, wpe at wpe_offset) of a gradient whose element lo is `dwindow`. The rows
// go to the kernel through `scratch`, `ops`' memory, grown as needed and kept by the caller
// (so a device backend allocates once, not every step).
void AddEmbeddingRows(Ops* ops, const float* packed, int B, int T, int C, size_t wpe_offset,
                      float* dwindow, size_t lo, size_t hi, Buffer* scratch);

// What a dp memory on `ops` answers to StageMemory::TiedUnitReadyAfterHead. On host memory,
// yes: the reduction of the tied table overlaps the layers' backward, and the embedding's
// rows follow as a gather of every rank's B*T rows (PackEmbeddingRows), cheap beside it at
// CPU batch sizes. On a device, no: those rows go through host memory on both sides, and
// at GPU batch sizes (B*T = 32k tokens of GPT-2's 50k-row table) the gather moves more than
// the table itself; the unit is reduced whole, on the device, after the embedding's backward.
bool TiedUnitReadyAfterHeadOn(Ops* ops);

// Whether the embedding rows of `unit` reach a dp memory after the unit was made ready: the
// tied unit of a single stage where it is ready after the head (`tied_ready_after_head`,
// TiedUnitReadyAfterHeadOn). Its reduction is completed by AddEmbeddingGrads, so what must
// follow the whole reduction (hybrid sharding's average over the replicas) waits for them.
inline bool RowsFollowReady(const GptLayout& layout, bool tied_ready_after_head, int unit) {
  return tied_ready_after_head && unit == layout.embedding_unit() && unit == layout.head_unit();
}

// Floats one rank holds for the model state (activations not counted).
struct MemoryUsage {
  size_t params = 0;   // whole arena, or the shard under ZeRO-3
  size_t grads = 0;    // whole arena, or the shard under ZeRO-2/3
  size_t working = 0;  // transient unit buffers (ZeRO-2/3): the most ever held at once
};

class TrainingMemory : public StageMemory {
 public:
  // Gradients of this step's micro-batches start from zero.
  virtual void BeginStep() = 0;
  // Whether the micro-batch whose Backward comes next is the step's last.
  virtual void SetLastMicroBatch(bool last) = 0;
  // Waits for every reduction of the step. `sync_deferred`, when set, runs first on the
  // units excluded from bucketing (the tied embedding of a pipeline, summed between its
  // first and last stage before the dp reduction); it receives the gradient arena.
  virtual Status FinishGradients(const std::function<Status(float* grads)>& sync_deferred) = 0;

  // The range of the local arena this rank updates, and its parameters and gradients
  // (pointers to element owned_begin()).
  virtual size_t owned_begin() const = 0;
  virtual size_t owned_end() const = 0;
  virtual float* owned_params() = 0;
  virtual float* owned_grads() = 0;
  // This rank's index among the dp ranks that own the same range and hold identical values
  // in it: its dp rank at stage 0 (every rank owns everything), its replica under hybrid
  // sharding, else 0. Sums over the world (the gradient norm) count replica 0's part only.
  virtual int owned_replica() const = 0;
  // After the optimizer changed owned_params(): every rank's whole parameters current
  // again (all-gather for stages 1 and 2).
  virtual Status PublishParams() = 0;

  // The whole local arena's parameters (num_params floats, host memory): a gather under
  // stage 3, a copy otherwise. Collective over dp for stage 3: every dp rank must call it.
  virtual Status ExportParams(float* local) = 0;
  // Takes this rank's part of `local` (the whole local arena, host memory).
  virtual void ImportParams(const float* local) = 0;
  // Whether that part is the owned range only (stage 3, which keeps no other parameters);
  // else it is the whole local arena.
  virtual bool params_sharded() const = 0;
  // This rank's even share of the local arena over dp (the owned range under ZeRO; under
  // hybrid sharding, its replica's even part of the owned range), and the all-gather that
  // completes `whole` (num_params floats, host memory) from every dp rank's share, at any
  // stage. A checkpoint restore reads only the share and gathers the rest (the replicas of
  // stage 0 and of hybrid sharding, and the parameters of stages 1 and 2); a checkpoint
  // writes it. Every dp rank's share together tile the local arena. Collective over dp.
  virtual size_t share_begin() const = 0;
  virtual size_t share_end() const = 0;
  virtual Status GatherShares(float* whole) = 0;
  // `whole` (num_params floats, host memory) holds this rank's owned slice; afterwards it
  // holds every rank's (an all-gather over the shard group; nothing to do at stage 0).
  // For optimizer state, which is sharded like the owned range. Collective over dp.
  virtual Status GatherOwned(float* whole) = 0;

  virtual MemoryUsage memory_usage() const = 0;

  // Seconds the stream spent reducing / the trainer spent waiting for it this step.
  virtual double comm_busy_seconds() const = 0;
  virtual double comm_blocked_seconds() const = 0;
  // What of comm_blocked_seconds() is the rank's wait for its dp peers that its dp group
  // left uncounted (CommStream::overlapped_waits_seconds).
  virtual double comm_overlapped_waits_seconds() const = 0;
};

}  // namespace drover::engine::parallel
