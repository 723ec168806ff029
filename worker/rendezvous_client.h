// Trainer-side client of the coordinator's RendezvousService: a key-value store scoped to
// one (job, attempt). Used to exchange the NCCL unique id and to back Gloo's store.
//
// Every call has a deadline. A call from an attempt the coordinator has moved past fails
// with FailedPrecondition (fencing): the trainer should exit. A call that finds the
// coordinator away fails Unavailable, and the next call dials afresh (as the agent does), so
// that a restarted coordinator is reached at once rather than after gRPC's reconnect
// back-off, which after a coordinator killed outright was 5-15 s of further refusals.
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/tls.h"
#include "proto/drover.grpc.pb.h"

namespace drover {

class RendezvousClient {
 public:
  // `rpc_timeout_ms` bounds Set/Get/Add; Wait uses its own timeout plus that margin.
  // `tls`: how to dial (worker/grpc_util.h); plaintext when not enabled.
  RendezvousClient(const std::string& coordinator, std::string job_id, int64_t attempt,
                   int64_t rpc_timeout_ms = 10000, const TlsCredentials& tls = {});

  Status Set(const std::string& key, const std::string& value);
  // nullopt when the key does not exist (yet).
  StatusOr<std::optional<std::string>> Get(const std::string& key);
  // Blocks until every key exists; DeadlineExceeded after `timeout_ms`.
  Status Wait(const std::vector<std::string>& keys, int64_t timeout_ms);
  // Atomically adds `delta` to the integer under `key` (0 when absent); returns the sum.
  StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Confirms this trainer's lease on the attempt (worker/attempt_lease.h).
  Status ConfirmLease();

  // Wait for `key`, then Get it: the value another rank Set.
  StatusOr<std::string> WaitGet(const std::string& key, int64_t timeout_ms);

 private:
  using Stub = v1::RendezvousService::Stub;

  v1::KvKey Key(const std::string& key) const;
  std::shared_ptr<Stub> stub() EXCLUDES(mu_);
  // `result` of a call made through `used`; replaces that stub with one on a fresh channel
  // when the call found the coordinator away (Unavailable).
  Status Checked(const std::shared_ptr<Stub>& used, Status result) EXCLUDES(mu_);

  const std::string address_;
  const std::string job_id_;
  const int64_t attempt_;
  const int64_t rpc_timeout_ms_;
  const TlsCredentials tls_;
  Mutex mu_;
  std::shared_ptr<Stub> stub_ GUARDED_BY(mu_);
};

}  // namespace drover
