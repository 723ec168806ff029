// Trainer-side client of the coordinator's RendezvousService: a key-value store scoped to
// one (job, attempt). Used to exchange the NCCL unique id and to back Gloo's store.
//
// Every call has a deadline. A call from an attempt the coordinator has moved past fails
// with FailedPrecondition (fencing): the trainer should exit. Thread-safe (gRPC stubs are).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  v1::KvKey Key(const std::string& key) const;

  std::string address_;
  std::string job_id_;
  int64_t attempt_;
  int64_t rpc_timeout_ms_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
};

}  // namespace drover
