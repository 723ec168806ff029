// gRPC at the boundary: channel creation and grpc::Status -> Status translation, shared by
// the agent, the trainer-side rendezvous client and the CLI.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace drover {

// An insecure channel to `address` (host:port). Never fails: gRPC connects lazily, so an
// unreachable peer shows up as UNAVAILABLE on the first call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);

// Sets a deadline `timeout_ms` from now on `ctx`.
inline void SetDeadlineMs(grpc::ClientContext* ctx, int64_t timeout_ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// Translates a gRPC status into drover's codes; `context` (e.g. "Heartbeat to
// 127.0.0.1:7600") prefixes the message.
Status FromGrpcStatus(const grpc::Status& status, std::string_view context);

}  // namespace drover
