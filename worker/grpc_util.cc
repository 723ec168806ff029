#include "worker/grpc_util.h"

#include "common/grpc_runtime.h"

namespace drover {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const TlsCredentials& tls) {
  TuneGrpcRuntime();
  grpc::ChannelArguments args;
  // Reconnect quickly after the coordinator restarts: gRPC's default back-off grows to
  // minutes, far longer than the agent's own retry cap.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the time one connection
  // attempt may last (20 s by default), the TCP and TLS handshakes included. At 100 ms one
  // lost SYN (sent again after 1 s), or handshakes slower than 100 ms, failed the attempt
  // and with it the call: 6 of 40 CLI calls over a link that drops 5% of its packets, and 3
  // of a job's first 4 attempts at 2% (tests/integration/netns_cluster_test.sh lossy);
  // none with the default (GrpcUtilTest.ACallOutlastsALostSyn).
  // A private subchannel pool: a fresh channel (see the agent's ResetChannel) then really
  // dials at once instead of inheriting a shared subchannel's back-off.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Small messages only (heartbeats, reports, log chunks): no bandwidth-delay probing,
  // whose PINGs cost more than the heartbeats (coordinator/server.cc turns it off too).
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (!tls.enabled) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls.ca_pem;
  ssl.pem_private_key = tls.key_pem;
  ssl.pem_cert_chain = tls.cert_pem;
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

void AddBearerToken(grpc::ClientContext* ctx, const std::string& token) {
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
}

Status FromGrpcStatus(const grpc::Status& status, std::string_view context) {
  if (status.ok()) return OkStatus();
  StatusCode code = StatusCode::kInternal;
  switch (status.error_code()) {
    case grpc::StatusCode::CANCELLED:
      code = StatusCode::kCancelled;
      break;
    case grpc::StatusCode::INVALID_ARGUMENT:
      code = StatusCode::kInvalidArgument;
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      code = StatusCode::kDeadlineExceeded;
      break;
    case grpc::StatusCode::NOT_FOUND:
      code = StatusCode::kNotFound;
      break;
    case grpc::StatusCode::ALREADY_EXISTS:
      code = StatusCode::kAlreadyExists;
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      code = StatusCode::kResourceExhausted;
      break;
    case grpc::StatusCode::FAILED_PRECONDITION:
      code = StatusCode::kFailedPrecondition;
      break;
    case grpc::StatusCode::ABORTED:
      code = StatusCode::kAborted;
      break;
    case grpc::StatusCode::OUT_OF_RANGE:
      code = StatusCode::kOutOfRange;
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      code = StatusCode::kUnimplemented;
      break;
    case grpc::StatusCode::UNAVAILABLE:
      code = StatusCode::kUnavailable;
      break;
    case grpc::StatusCode::DATA_LOSS:
      code = StatusCode::kDataLoss;
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      code = StatusCode::kPermissionDenied;
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      code = StatusCode::kUnauthenticated;
      break;
    default:
      code = StatusCode::kInternal;
      break;
  }
  std::string message = status.error_message();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && message.empty()) {
    message = "unavailable";
  }
  return Status(code, std::string(context) + ": " + message);
}

}  // namespace drover
