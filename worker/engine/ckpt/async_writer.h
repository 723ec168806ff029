// Background checkpoint writer: the trainer hands over a host-memory snapshot and keeps
// training while a thread writes it (DESIGN.md "Saving is asynchronous").
//
// At most one snapshot is in flight: Submit waits for the previous write to finish
// first, so host memory holds at most two copies of the arenas (the live ones and one
// snapshot) and checkpoints complete in step order. After each successful write the
// writer prunes to keep_last and calls `on_complete` (on the writer thread).
//
// Thread-safety: Submit, Flush and the destructor are called from one (the training)
// thread; on_complete runs on the writer thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"
#include "worker/engine/ckpt/checkpoint.h"

namespace drover::engine::ckpt {

class AsyncCheckpointWriter {
 public:
  // Called after a checkpoint directory became complete: (step, final path).
  using OnComplete = std::function<void(const v1::CheckpointManifest&, const std::string&)>;
  // Called when writing the checkpoint of `step` failed (its partial files are removed).
  using OnFailure = std::function<void(int64_t step, const Status&)>;

  AsyncCheckpointWriter(std::string dir, int keep_last, OnComplete on_complete,
                        OnFailure on_failure = nullptr);
  // Finishes the write in flight (a checkpoint the trainer already paid for is worth the
  // wait), then joins the thread.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Waits for the previous write, then queues `snap`. Returns the previous write's error,
  // if it failed (the new snapshot is queued regardless).
  Status Submit(CheckpointSnapshot snap);

  // Writes `snap` on the calling thread (after the write in flight), for synchronous
  // checkpoints and the final one.
  Status WriteNow(const CheckpointSnapshot& snap);

  // Waits until nothing is in flight; returns the error of the last write, if any.
  Status Flush();

 private:
  void Loop();
  Status WriteAndPrune(const CheckpointSnapshot& snap);

  const std::string dir_;
  const int keep_last_;
  const OnComplete on_complete_;
  const OnFailure on_failure_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<CheckpointSnapshot> pending_;  // guarded by mu_
  bool busy_ = false;                          // guarded by mu_: a write is running
  bool stop_ = false;                          // guarded by mu_
  Status last_error_;                          // guarded by mu_
  std::thread thread_;                         // started last
};

}  // namespace drover::engine::ckpt
