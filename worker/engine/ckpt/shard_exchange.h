// ShardExchange: how the ranks of one checkpoint tell rank 0 that their shards are durable
// (DESIGN.md "Checkpoints": step_N/ is published only when every rank's shard is).
//
// Each rank > 0 Publishes the manifest entries of the shard files it wrote (or why it could
// not write them); rank 0 Collects every rank's before it commits. Over the job's bootstrap
// key-value store (the coordinator's rendezvous service, or the one `drover train --nproc`
// serves), whose keys belong to one attempt, so an older attempt's reports are never seen.
//
// Thread-safety: Publish and Collect may be called from any thread (the checkpoint writer's).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "proto/drover.pb.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::ckpt {

class ShardExchange {
 public:
  virtual ~ShardExchange() = default;
  // Rank `rank` (> 0) reports its shard of checkpoint `step`: durable with these entries, or
  // failed with this status. A store that is Unavailable (the coordinator restarting) is
  // tried again until the exchange's timeout, or until the trainer is asked to stop.
  virtual Status Publish(int64_t step, int rank,
                         const StatusOr<std::vector<v1::CheckpointShard>>& result) = 0;
  // Rank 0: the entries of ranks 1..world_size-1 for `step`, once all reported; the first
  // failure a rank reported (naming the rank); DeadlineExceeded when one never reports (or
  // the store's Unavailable, when that lasts the whole timeout); Cancelled when the trainer
  // is asked to stop meanwhile.
  virtual StatusOr<std::vector<v1::CheckpointShard>> Collect(int64_t step, int world_size) = 0;
  // True while a Publish or Collect waits to try a store again that was Unavailable (the
  // coordinator is away), as opposed to waiting for a peer's report. Cheap; any thread.
  virtual bool Unreachable() const { return false; }
  // Rank 0, once before its first Collect (Collect does it too, when it has not been done):
  // leaves a mark in the store by which Collect tells a report lost to a store that
  // restarted (the coordinator's rendezvous service keeps its keys in memory) from one not
  // made yet. Best effort: an error only means a restart before the next Collect goes
  // unnoticed until that Collect's timeout.
  virtual Status MarkStore() { return OkStatus(); }
};

class KvShardExchange final : public ShardExchange {
 public:
  // `store` and `stop` (may be null) must outlive this. `timeout` bounds Collect: how long
  // rank 0 waits for the slowest rank's shard to become durable. Once Collect finds that
  // the store restarted (its mark gone), the reports made before are lost, and it waits
  // only `after_restart` more for those still to come before it gives the checkpoint up.
  KvShardExchange(parallel::KvStore* store, std::chrono::milliseconds timeout,
                  const std::atomic<bool>* stop,
                  std::chrono::milliseconds after_restart = std::chrono::seconds(30));

  Status Publish(int64_t step, int rank,
                 const StatusOr<std::vector<v1::CheckpointShard>>& result) override;
  StatusOr<std::vector<v1::CheckpointShard>> Collect(int64_t step, int world_size) override;
  bool Unreachable() const override { return unreachable_.load(std::memory_order_relaxed); }
  Status MarkStore() override;

 private:
  bool Stopped() const;
  // True when the store is known to have lost the mark MarkStore left: it restarted.
  bool StoreRestarted();
  StatusOr<std::vector<v1::CheckpointShard>> CollectAll(int64_t step, int world_size);
  // Notes what the store's last answer says of the coordinator: Unreachable() from an
  // Unavailable answer until another answer, or until the Publish or Collect returns.
  void Heard(StatusCode code) {
    unreachable_.store(code == StatusCode::kUnavailable, std::memory_order_relaxed);
  }

  parallel::KvStore* const store_;
  const std::chrono::milliseconds timeout_;
  const std::atomic<bool>* const stop_;
  const std::chrono::milliseconds after_restart_;
  std::atomic<bool> unreachable_{false};
  std::atomic<bool> marked_{false};  // the store holds MarkStore's mark, as far as known
};

}  // namespace drover::engine::ckpt
