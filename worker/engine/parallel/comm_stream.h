// CommStream: a thread that runs communication work in submission order, so that the
// training thread can start a reduction (a gradient bucket, a ZeRO-3 gather) and go on
// computing while it runs (DESIGN.md: "gradients reduced in buckets, overlapped with
// backward"). The CUDA backend gets the same shape from a second cudaStream_t.
//
// Errors are sticky: once a piece of work fails, every later piece is skipped and reports
// that first error (the communicator it used is broken anyway, communicator.h).
//
// Thread-safety: Submit, Wait and WaitAll are called from one thread (the training
// thread); the work runs on the stream's own thread. The stream's thread runs CPU kernels
// single-threaded (OpenMP) so that they do not compete with the training thread's team.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/status.h"
#include "worker/engine/kernels/ops.h"

namespace drover::engine::parallel {

class CommStream {
 public:
  using Ticket = uint64_t;

  // compute: the rank's kernel table, through which Wait tells when the rank's own work has
  // run out (ops.h's WorkMarks); null: at the call, as on the CPU. Not owned; outlives this.
  explicit CommStream(std::string name, WorkMarks* compute = nullptr);
  // Finishes the queued work, then joins the thread.
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `work`; its ticket is larger than every earlier one.
  Ticket Submit(std::function<Status()> work);
  // Blocks until the work of `ticket` (and everything before it) has run. Returns the
  // stream's first error if one happened at or before `ticket`. The caller counts as
  // blocked (blocked_seconds) only once the compute it enqueued before the call has
  // finished: a GPU may still be running the backward that the work overlaps.
  Status Wait(Ticket ticket);
  // Blocks until the queue is empty; returns the stream's first error, if any.
  Status WaitAll();

  // Seconds spent running work, and seconds the caller stalled in Wait/WaitAll (blocked, its
  // own compute done), since the last ResetTimes(): the fraction of communication hidden
  // behind compute is 1 - blocked / busy.
  double busy_seconds() const;
  double blocked_seconds() const { return blocked_s_; }
  void ResetTimes();
  // blocked_seconds() where the stream's work ran collectives whose groups left them
  // uncounted (communicator.h, OverlappedCalls): what the rank waited for them. 0 otherwise.
  double overlapped_waits_seconds() const {
    return left_uncounted_.load(std::memory_order_relaxed) ? blocked_s_ : 0;
  }

 private:
  void Loop();

  const std::string name_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::pair<Ticket, std::function<Status()>>> queue_ GUARDED_BY(mu_);
  Ticket next_ticket_ GUARDED_BY(mu_) = 1;
  Ticket done_ GUARDED_BY(mu_) = 0;       // every ticket <= done_ has run
  Ticket failed_at_ GUARDED_BY(mu_) = 0;  // ticket of the first error, 0 if none
  Status error_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  double busy_s_ GUARDED_BY(mu_) = 0;
  double blocked_s_ = 0;                     // touched by the caller's thread only
  WorkMarks* const compute_;                 // may be null
  std::atomic<bool> left_uncounted_{false};  // OverlappedCalls' flag of the stream's thread
  std::thread thread_;                       // started last
};

}  // namespace drover::engine::parallel
