// Background checkpoint writer, one per rank: the trainer hands over a host-memory copy of
// the shard it owns and keeps training while a thread writes it (DESIGN.md "Saving is
// asynchronous").
//
// Every rank writes its shard files (WriteShard); ranks > 0 then report them through the
// ShardExchange; rank 0 collects every report, commits step_N/ (CommitCheckpoint), prunes
// to keep_last and calls `on_complete`. A checkpoint a rank could not write is abandoned
// (rank 0 removes its tmp directory once every rank has reported) and `on_failure` is
// called; training goes on and the next interval tries again.
//
// At most one snapshot is in flight per rank: Submit waits for the previous write to finish
// first, so checkpoints complete in step order. (The trainer does not submit while one has
// been in flight for long, InFlightFor, or waits on a coordinator it cannot reach,
// WaitingOnCoordinator, so that a write waiting on the coordinator or a slow disk never holds
// up training: it defers the checkpoint instead. A write that comes to wait on the
// coordinator only after the trainer decided to save is why Submit may give a part up.)
//
// The shard copy of a finished write is kept for the next snapshot (TakeRecycled): a fresh
// host copy of GPT-2 124M's state (3 x 0.5 GB) spends about 0.7 s of the training thread's
// time faulting in and zeroing new pages, a reused one only the copy (0.13 s; measured on
// the 2-core development machine). The cost is one idle shard copy in host memory between
// checkpoints; host memory holds at most two beside the live state.
//
// Thread-safety: Submit, WriteNow, Flush and the destructor are called from one (the
// training) thread; the callbacks run on the writer thread (or the caller's, for WriteNow).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/status.h"
#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/ckpt/shard_exchange.h"
#include "worker/engine/publish_fence.h"

namespace drover::engine::ckpt {

// One rank's part of checkpoint meta.step(): the manifest fields (rank 0's are published)
// and the shard.
struct ShardSnapshot {
  v1::CheckpointManifest meta;
  RankShard shard;
};

class AsyncCheckpointWriter {
 public:
  // Called on rank 0 after a checkpoint directory became complete: (manifest, final path).
  using OnComplete = std::function<void(const v1::CheckpointManifest&, const std::string&)>;
  // Called when this rank's part of the checkpoint of `step` failed (on rank 0: when the
  // checkpoint as a whole failed, for any rank's reason).
  using OnFailure = std::function<void(int64_t step, const Status&)>;
  // Told how this rank's write of the shard files of `step` goes (WriteShard's progress), on
  // the thread that writes.
  using OnProgress = std::function<void(int64_t step, int64_t bytes_written, int64_t total)>;

  struct Options {
    std::string dir;
    int rank = 0;
    int world_size = 1;
    int keep_last = 3;
    ShardExchange* exchange = nullptr;  // required when world_size > 1; not owned
    // Rank 0 commits and prunes only once the fence confirms this attempt is current
    // (nullptr: always), waiting up to fence_timeout while it cannot be confirmed, and gives
    // the checkpoint up when the attempt is superseded or `stop` is set. Not owned.
    PublishFence* fence = nullptr;
    std::chrono::milliseconds fence_timeout{std::chrono::minutes(2)};
    const std::atomic<bool>* stop = nullptr;
    // What the shards, the commit and the pruning write through. Not owned.
    FileSystem* fs = FileSystem::Default();
    OnComplete on_complete;
    OnFailure on_failure;
    OnProgress on_progress;
  };

  explicit AsyncCheckpointWriter(Options options);
  // Finishes the write in flight (a checkpoint the trainer already paid for is worth the
  // wait), then joins the thread.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Waits for the previous write, then queues `snap`. Returns the previous write's error,
  // if it failed (the new snapshot is queued regardless).
  //
  // `may_give_up`: while the previous write waits on a coordinator it cannot reach
  // (WaitingOnCoordinator), which may last as long as the coordinator's outage, this rank's
  // part of `snap` is given up instead of waited for: its memory is freed at once, and once
  // the previous write is done this rank reports the part as failed, as a rank that could
  // not write it would, so rank 0 abandons that checkpoint (on_failure names why). Only one
  // part at a time: with one given up and still queued, Submit waits.
  Status Submit(ShardSnapshot snap, bool may_give_up = false);

  // True while the write in flight waits on a coordinator it cannot reach: rank 0's fence
  // confirmation, or the shard exchange's store, last answered Unavailable. A wait for a
  // peer's report or for the disk is not one. Any thread.
  bool WaitingOnCoordinator() const;

  // Writes `snap` on the calling thread (after the write in flight), for synchronous
  // checkpoints.
  Status WriteNow(ShardSnapshot snap);

  // The shard of the newest finished write, to copy the next snapshot into (its vectors
  // keep their memory); an empty shard when there is none (none finished yet, or it was
  // taken already). Called from the training thread.
  RankShard TakeRecycled();

  // Waits until nothing is in flight; returns the error of the last write, if any.
  Status Flush();

  // How long the snapshot queued or being written, reported or committed (which Submit
  // would wait for) has been in flight since its Submit; nullopt when none is. Called from
  // the training thread, which alone submits, so a nullopt stays so until its next Submit.
  std::optional<std::chrono::milliseconds> InFlightFor();

 private:
  // A snapshot queued for the writer thread; one whose part this rank gave up (Submit's
  // may_give_up) has an empty shard and `given_up` says why.
  struct Pending {
    ShardSnapshot snap;
    Status given_up;
  };

  void Loop();
  Status Save(const ShardSnapshot& snap, const Status& given_up);
  Status Fail(int64_t step, Status st);

  const Options options_;
  std::atomic<bool> fence_unreachable_{false};  // ConfirmWithin's, of the write in flight

  Mutex mu_;
  CondVar cv_;
  std::optional<Pending> pending_ GUARDED_BY(mu_);
  int64_t busy_step_ GUARDED_BY(mu_) = -1;                           // of the running write
  bool busy_ GUARDED_BY(mu_) = false;                                // a write is running
  std::chrono::steady_clock::time_point submitted_ GUARDED_BY(mu_);  // of the one in flight
  bool stop_ GUARDED_BY(mu_) = false;
  Status last_error_ GUARDED_BY(mu_);
  RankShard recycled_ GUARDED_BY(mu_);
  std::thread thread_;  // started last
};

}  // namespace drover::engine::ckpt
