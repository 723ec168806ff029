#include "coordinator/auth.h"

#include <array>
#include <string>

#include "common/tls.h"

namespace drover::coordinator {
namespace {

struct MethodEntry {
  std::string_view name;
  MethodClass kind;
};

// Every method of proto/drover.proto. A new one is refused to read-only tokens until it
// is listed here (auth_test checks that every JobService method is).
constexpr std::array<MethodEntry, 24> kMethods = {{
    {"/drover.v1.WorkerService/Register", MethodClass::kAgent},
    {"/drover.v1.WorkerService/Heartbeat", MethodClass::kAgent},
    {"/drover.v1.WorkerService/ReportTrainerExit", MethodClass::kAgent},
    {"/drover.v1.WorkerService/AppendLogs", MethodClass::kAgent},
    {"/drover.v1.WorkerService/Watch", MethodClass::kAgent},
    {"/drover.v1.RendezvousService/Set", MethodClass::kAgent},
    {"/drover.v1.RendezvousService/Get", MethodClass::kAgent},
    {"/drover.v1.RendezvousService/Wait", MethodClass::kAgent},
    {"/drover.v1.RendezvousService/Add", MethodClass::kAgent},
    {"/drover.v1.RendezvousService/ConfirmLease", MethodClass::kAgent},
    {"/drover.v1.JobService/GetJob", MethodClass::kRead},
    {"/drover.v1.JobService/ListJobs", MethodClass::kRead},
    {"/drover.v1.JobService/ListWorkers", MethodClass::kRead},
    {"/drover.v1.JobService/ReadLogs", MethodClass::kRead},
    {"/drover.v1.JobService/SubmitJob", MethodClass::kWrite},
    {"/drover.v1.JobService/CancelJob", MethodClass::kWrite},
    {"/drover.v1.JobService/SuspendJob", MethodClass::kWrite},
    {"/drover.v1.JobService/ResumeJob", MethodClass::kWrite},
    {"/drover.v1.JobService/SetPriority", MethodClass::kWrite},
    {"/drover.v1.JobService/SetTimeLimit", MethodClass::kWrite},
    {"/drover.v1.JobService/CheckpointJob", MethodClass::kWrite},
    {"/drover.v1.JobService/DeleteJob", MethodClass::kWrite},
    {"/drover.v1.JobService/Uncordon", MethodClass::kWrite},
    {"/drover.v1.JobService/Cordon", MethodClass::kWrite},
}};

std::string ShortName(std::string_view method) {
  const size_t slash = method.rfind('/');
  return std::string(slash == std::string_view::npos ? method : method.substr(slash + 1));
}

constexpr std::string_view kBearer = "Bearer ";

}  // namespace

std::optional<MethodClass> ClassifyMethod(std::string_view method) {
  for (const MethodEntry& m : kMethods) {
    if (m.name == method) return m.kind;
  }
  return std::nullopt;
}

Status Authorize(const AuthPolicy& policy, std::string_view method, const CallCredentials& creds) {
  const MethodClass kind = ClassifyMethod(method).value_or(MethodClass::kWrite);
  if (kind == MethodClass::kAgent) {
    if (!policy.require_client_cert || creds.client_cert) return OkStatus();
    return UnauthenticatedError(
        ShortName(method) +
        " needs a cluster client certificate: start the worker with --tls-cert and --tls-key "
        "(a certificate signed by the cluster CA) and --tls-ca");
  }
  if (policy.tokens.empty()) return OkStatus();
  if (creds.authorization.empty()) {
    return UnauthenticatedError("this call needs a token: give --token-file or $DROVER_TOKEN");
  }
  if (!creds.authorization.starts_with(kBearer)) {
    return UnauthenticatedError("the authorization metadata must be 'Bearer TOKEN'");
  }
  const TokenEntry* entry = FindToken(policy.tokens, creds.authorization.substr(kBearer.size()));
  if (entry == nullptr) {
    return UnauthenticatedError(
        "the token is not valid on this coordinator (not in its --tokens file)");
  }
  if (kind == MethodClass::kWrite && entry->role != Role::kAdmin) {
    return PermissionDeniedError("the token of '" + entry->name + "' is read-only; " +
                                 ShortName(method) + " needs an admin token");
  }
  return OkStatus();
}

Status CheckExposure(std::string_view listen_host, bool tls, bool tokens, bool insecure) {
  if (IsLoopbackHost(listen_host) || insecure || (tls && tokens)) return OkStatus();
  std::string missing;
  if (!tls) missing = "TLS (--tls-cert, --tls-key, --tls-ca)";
  if (!tokens) missing += std::string(missing.empty() ? "" : " and ") + "tokens (--tokens FILE)";
  return InvalidArgumentError("--listen " + std::string(listen_host) +
                              " is reachable from other machines, and " + missing +
                              (tls || tokens ? " is" : " are") +
                              " missing: anyone who reaches the port could run and cancel "
                              "jobs. Add them, or pass --insecure to serve anyway");
}

Status CheckDashboardExposure(std::string_view http_host, bool insecure) {
  if (IsLoopbackHost(http_host) || insecure) return OkStatus();
  return InvalidArgumentError(
      "--http " + std::string(http_host) +
      " is reachable from other machines, and the dashboard and /metrics have no "
      "authentication: anyone who reaches the port could read every job, node and log "
      "line it shows. Serve it on loopback (behind an authenticating proxy), or pass "
      "--insecure to serve anyway");
}

}  // namespace drover::coordinator
