#include "coordinator/authorizer.h"

#include <grpc/grpc_security_constants.h>
#include <spdlog/spdlog.h>

#include "coordinator/grpc_status.h"

namespace drover::coordinator {

grpc::Status Authorizer::Check(const grpc::ServerContextBase& ctx, std::string_view method) const {
  // Nothing configured: nothing to look up (every heartbeat comes through here).
  if (!policy_.require_client_cert && policy_.tokens.empty()) return grpc::Status::OK;
  CallCredentials creds;
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    creds.authorization = std::string_view(it->second.data(), it->second.size());
  }
  // The server asks for client certificates and verifies any it gets
  // (GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY): one that is present was checked.
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  creds.client_cert =
      auth != nullptr && !auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME).empty();
  Status decision = Authorize(policy_, method, creds);
  if (decision.ok()) return grpc::Status::OK;
  spdlog::warn("refused {} from {}: {}", method, ctx.peer(), decision.message());
  return ToGrpcStatus(decision);
}

}  // namespace drover::coordinator
