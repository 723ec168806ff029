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

namespace drover::engine::parallel {

class CommStream {
 public:
  using Ticket = uint64_t;

  explicit CommStream(std::string name);
  // Finishes the queued work, then joins the thread.
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `work`; its ticket is larger than every earlier one.
  Ticket Submit(std::function<Status()> work);
  // Blocks until the work of `ticket` (and everything before it) has run. Returns the
  // stream's first error if one happened at or before `ticket`.
  Status Wait(Ticket ticket);
  // Blocks until the queue is empty; returns the stream's first error, if any.
  Status WaitAll();

  // Seconds spent running work, and seconds callers spent blocked in Wait/WaitAll, since
  // the last ResetTimes(): the fraction of communication hidden behind compute is
  // 1 - blocked / busy.
  double busy_seconds() const;
  double blocked_seconds() const { return blocked_s_; }
  void ResetTimes();
  // blocked_seconds() where the stream's work ran collectives of a group that times its
  // waits on the host and left them to the stream (communicator.h, OverlappedCalls): what
  // the rank waited for them. 0 otherwise (a device-timed group counts its own).
  double host_waits_seconds() const {
    return host_timed_.load(std::memory_order_relaxed) ? blocked_s_ : 0;
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
  double blocked_s_ = 0;                 // touched by the caller's thread only
  std::atomic<bool> host_timed_{false};  // OverlappedCalls' flag of the stream's thread
  std::thread thread_;                   // started last
};

}  // namespace drover::engine::parallel
