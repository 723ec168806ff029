// PublishFence: whether this trainer's attempt may still write where the job's current
// attempt writes (DESIGN.md "fencing"; the split-brain part of elastic recovery).
//
// A network partition can leave a trainer running while the coordinator, which no longer
// hears its node, starts the job's next attempt elsewhere; both then train at once into the
// same output and checkpoint directories. The trainer therefore publishes (appends to
// metrics.jsonl, commits and prunes checkpoints) only while a lease on its attempt is
// current: confirmed by the coordinator within a validity shorter than the coordinator's
// node timeout, so that by the time another attempt can start this one has stopped
// publishing. A superseded attempt learns so at its next confirmation and stops.
//
// Outside a coordinator there is no fence (nullptr): a `drover train` run owns its
// directories.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>

#include "common/status.h"

namespace drover::engine {

class PublishFence {
 public:
  virtual ~PublishFence() = default;
  // Cheap: the lease was confirmed within its validity.
  virtual bool Current() const = 0;
  // A confirmation now (a round trip to the coordinator): OK; FailedPrecondition when the
  // attempt is superseded; Unavailable or DeadlineExceeded when it cannot be reached.
  virtual Status Confirm() = 0;
};

// Confirms through `fence` (nullptr: OK at once), retrying every 200 ms while the coordinator
// cannot be reached, for up to `timeout`: a short coordinator restart is ridden through.
// FailedPrecondition (superseded) at once; Cancelled when `stop` (may be null) is set.
// `unreachable` (may be null) is true while a confirmation has failed and the next is
// awaited, false once it returns.
Status ConfirmWithin(PublishFence* fence, std::chrono::milliseconds timeout,
                     const std::atomic<bool>* stop, std::atomic<bool>* unreachable = nullptr);

}  // namespace drover::engine
