// gRPC at the boundary: channel creation and grpc::Status -> Status translation, shared by
// the agent, the trainer-side rendezvous client and the CLI.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/tls.h"

namespace drover {

// A channel to `address` (host:port): plaintext when `tls` is not enabled, else TLS that
// checks the server against tls.ca_pem and presents tls.cert_pem when there is one (mutual
// TLS). The server certificate must name the host dialled (a DNS or IP SAN). Never fails:
// gRPC connects lazily, so an unreachable peer, or a failed handshake, shows up as
// UNAVAILABLE on the first call.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const TlsCredentials& tls = {});

// Sends `token` as "authorization: Bearer <token>" with the call; nothing when empty.
// Over plaintext it travels in the clear: the coordinator refuses to listen beyond
// loopback without TLS unless told --insecure.
void AddBearerToken(grpc::ClientContext* ctx, const std::string& token);

// Sets a deadline `timeout_ms` from now on `ctx`.
inline void SetDeadlineMs(grpc::ClientContext* ctx, int64_t timeout_ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

// Translates a gRPC status into drover's codes; `context` (e.g. "Heartbeat to
// 127.0.0.1:7600") prefixes the message.
Status FromGrpcStatus(const grpc::Status& status, std::string_view context);

}  // namespace drover
