// Authorizer: the coordinator's handlers ask it, first thing, whether their call may run.
// It reads what the call presents (the "authorization" metadata, whether the TLS
// handshake checked a client certificate) and applies Authorize (auth.h); refusals are
// logged with the peer and the method, never with the token.
//
// Thread-safety: const after construction; Check may be called from any RPC thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string_view>

#include "coordinator/auth.h"

namespace drover::coordinator {

class Authorizer {
 public:
  explicit Authorizer(AuthPolicy policy = {}) : policy_(std::move(policy)) {}

  // OK, or the grpc::Status to answer `method` (a full name) with.
  grpc::Status Check(const grpc::ServerContextBase& ctx, std::string_view method) const;

  const AuthPolicy& policy() const { return policy_; }

 private:
  const AuthPolicy policy_;
};

}  // namespace drover::coordinator
