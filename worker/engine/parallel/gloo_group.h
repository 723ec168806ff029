// GlooGroup: the state one connected Gloo group shares between its communicator, its
// in-flight requests and the ring algorithms (gloo_ring.h). Internal to the Gloo backend.
//
// Error model (communicator.h's contract): every call into Gloo runs inside Run(), which
// turns any exception into a Status in one place (GlooExceptionToStatus) and breaks the
// group: the first error is kept, every later Run() returns it without touching Gloo, and
// the group's connections are closed at once. Closing matters twice: the Gloo event loop
// stops writing into buffers the caller gets back with the error, and the peers blocked on
// this rank see the connection close (Unavailable) instead of waiting out their timeout,
// so one dead rank fails the whole group within a round trip, not rank by rank.
//
// Thread-safety: none; one thread at a time (the communicator's).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "common/status.h"
#include "worker/engine/parallel/communicator.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace drover::engine::parallel {

using GlooClock = std::chrono::steady_clock;

// What a failed call was doing, for the message: "AllReduce", and the peer it was waiting
// on when known (-1: unknown).
struct GlooOp {
  const char* name;
  int peer = -1;
};

// Thrown through Gloo by the rendezvous adapter (gloo::rendezvous::Store reports errors only
// by throwing) and turned back into its Status by GlooExceptionToStatus.
class KvStoreError : public std::runtime_error {
 public:
  explicit KvStoreError(Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// The one translation of a Gloo (or store) exception into a Status, for group `where`:
// a timeout -> DeadlineExceeded; a closed or reset connection -> Unavailable; a failed
// KvStore call -> that call's Status; anything else -> Internal.
Status GlooExceptionToStatus(std::exception_ptr error, const std::string& where);

class GlooGroup {
 public:
  // `context` is connected, or null when size == 1.
  GlooGroup(std::string name, int rank, int size, std::chrono::milliseconds timeout,
            std::shared_ptr<gloo::Context> context);
  ~GlooGroup();

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  gloo::Context* context() const { return context_.get(); }
  const std::shared_ptr<gloo::Context>& shared_context() const { return context_; }

  // OK while the group is healthy; else its first error.
  const Status& error() const { return error_; }

  // A tag no earlier collective of this group used. Every rank calls the collectives in
  // the same order, so every rank draws the same tag for the same call.
  uint32_t NextCollectiveTag() { return next_tag_++; }

  // Runs `fn` (which calls into Gloo and may update op.peer) unless the group is broken,
  // adding its time to wait_seconds() (on a thread of OverlappedCalls, marking its flag).
  template <typename Fn>
  Status Run(GlooOp& op, Fn&& fn) {
    if (!error_.ok()) return error_;
    const auto started = GlooClock::now();
    try {
      fn();
      Count(GlooClock::now() - started);
      return OkStatus();
    } catch (...) {
      Count(GlooClock::now() - started);
      return Break(op, std::current_exception());
    }
  }

  // Seconds spent in Run so far (Communicator::wait_seconds); any thread may read it.
  double wait_seconds() const { return waited_.seconds(); }

  // The remaining time until `deadline`, at least 1 ms: Gloo reads 0 as "no wait" and
  // throws its own "Timed out" at once, which is what an expired deadline should do.
  static std::chrono::milliseconds Remaining(GlooClock::time_point deadline);

 private:
  Status Break(const GlooOp& op, std::exception_ptr error);
  void Count(GlooClock::duration waited) {
    if (std::atomic<bool>* overlapped = OverlappedCalls::Current()) {
      overlapped->store(true, std::memory_order_relaxed);
    } else {
      waited_.Add(waited);
    }
  }

  const std::string name_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<gloo::Context> context_;
  Status error_;
  uint32_t next_tag_ = 0;
  WaitTally waited_;
};

// "gloo group "dp" (rank 1 of 4) AllReduce with peer 2" (no peer part when unknown).
std::string DescribeGlooOp(const std::string& group, int rank, int size, const GlooOp& op);

}  // namespace drover::engine::parallel
