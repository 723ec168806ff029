// RendezvousStore: the per-attempt key-value store trainers use to find each other
// (NCCL unique id, Gloo's rendezvous::Store). Keys live in the namespace (job, attempt).
//
// Fencing: only the job's open attempt is served. A request for an older attempt, or for
// an attempt that ended, fails with FAILED_PRECONDITION; a job with no attempt opened is
// NOT_FOUND. Opening a newer attempt or closing one frees its namespace and wakes its
// waiters, which then fail the same way.
//
// Leases (worker/attempt_lease.h): a trainer confirms its attempt (ConfirmLease), and
// publishes (metrics lines, checkpoint commits) for `lease_ms` after each confirmation. A trainer
// of an earlier attempt may hold such a lease for up to `lease_ms` after its attempt stopped being
// served: a node declared dead by its agent's silence can still have a trainer that reaches the
// coordinator. So a new attempt's lease confirmations are refused (UNAVAILABLE, which the lease
// retries) until every lease of the attempts before it has lapsed, and the two never publish at
// once. A new attempt trains meanwhile; what it would publish waits.
//
// Thread-safe: every method may be called from any RPC thread; Wait blocks its caller (up
// to the timeout, capped at kMaxWaitMs) without holding anything else.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace drover::coordinator {

class RendezvousStore {
 public:
  static constexpr int64_t kMaxWaitMs = 300'000;

  // `clock` (not owned) times the leases; `lease_ms` is their validity (AttemptLeaseMs of
  // the node timeout), 0 where no trainer holds one.
  explicit RendezvousStore(const Clock* clock = SystemClock::Get(), int64_t lease_ms = 0)
      : clock_(clock), lease_ms_(lease_ms) {}

  // Makes `attempt` the job's served namespace (empty), dropping any older one. Its lease
  // confirmations are refused until the leases of the attempt before it have lapsed: from
  // when that one stopped being served, or from now when that is not known (a coordinator
  // restored from its state opens a later attempt first).
  void OpenAttempt(const std::string& job_id, int64_t attempt);
  // Ends `attempt` (no-op when it is not the open one): requests for it fail from now on.
  void CloseAttempt(const std::string& job_id, int64_t attempt);

  Status Set(const std::string& job_id, int64_t attempt, const std::string& key, std::string value);
  // nullopt when the key does not exist (yet).
  StatusOr<std::optional<std::string>> Get(const std::string& job_id, int64_t attempt,
                                           const std::string& key);
  // Returns OK once every key exists; DEADLINE_EXCEEDED (naming the missing keys) when they
  // do not within timeout_ms; FAILED_PRECONDITION when the attempt is superseded meanwhile.
  Status Wait(const std::string& job_id, int64_t attempt, const std::vector<std::string>& keys,
              int64_t timeout_ms);
  // Adds `delta` to the integer stored at `key` (absent = 0), stored as decimal text.
  StatusOr<int64_t> Add(const std::string& job_id, int64_t attempt, const std::string& key,
                        int64_t delta);
  // A trainer of `attempt` confirms its lease: OK when the attempt is served and the leases
  // of the attempts before it have lapsed; UNAVAILABLE (saying when it may) before that.
  Status ConfirmLease(const std::string& job_id, int64_t attempt);

 private:
  struct Namespace {
    int64_t attempt = 0;  // 0: none opened yet
    bool open = false;
    std::map<std::string, std::string> kv;
    int64_t served_until_ms = 0;  // clock_ ms when the attempt was closed
    int64_t leases_from_ms = 0;   // clock_ ms from which its leases are confirmed
  };
  // The job's namespace when `attempt` is its open one; else the error to return.
  StatusOr<Namespace*> Served(const std::string& job_id, int64_t attempt) REQUIRES(mu_);

  const Clock* const clock_;
  const int64_t lease_ms_;
  Mutex mu_;
  CondVar changed_;
  std::map<std::string, Namespace> jobs_ GUARDED_BY(mu_);
};

}  // namespace drover::coordinator
