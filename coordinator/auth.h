// Who may call what on the coordinator: one pure decision per call, and the start-up rule
// for exposing the coordinator beyond loopback.
//
// Two kinds of caller, two credentials:
//   agents and their trainers (WorkerService, RendezvousService) prove themselves with a
//   client certificate signed by the cluster CA (mutual TLS). The TLS handshake checks the
//   signature; a call here only asks whether a checked certificate came with it.
//   people and scripts (JobService) send a bearer token from the --tokens file; its role
//   decides between reading (status, jobs, logs, workers, wait) and changing (submit,
//   cancel, rm, uncordon).
// A credential that is not configured is not asked for: without TLS agents are not
// checked, without --tokens JobService is open. That is today's loopback set-up, and
// CheckExposure keeps it on loopback unless the operator says --insecure.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "coordinator/tokens.h"

namespace drover::coordinator {

struct AuthPolicy {
  // Mutual TLS is on: WorkerService and RendezvousService calls need a client certificate.
  bool require_client_cert = false;
  // Not empty: every JobService call needs one of these tokens.
  std::vector<TokenEntry> tokens;
};

// What one call presents.
struct CallCredentials {
  // The "authorization" metadata ("Bearer TOKEN"); empty when the call has none.
  std::string_view authorization;
  // The TLS handshake checked a client certificate against the cluster CA.
  bool client_cert = false;
};

enum class MethodClass {
  kAgent,  // an agent or a trainer of the cluster
  kRead,   // a person or script looking
  kWrite,  // a person or script changing the cluster's jobs
};

// The class of a full gRPC method name ("/drover.v1.JobService/SubmitJob"); nullopt for a
// method drover does not know.
std::optional<MethodClass> ClassifyMethod(std::string_view method);

// OK, or why `method` is refused to a caller presenting `creds`: Unauthenticated when a
// credential is missing or unknown, PermissionDenied when a read-only token asks to
// change something. An unknown method needs what a write needs.
Status Authorize(const AuthPolicy& policy, std::string_view method, const CallCredentials& creds);

// Start-up rule: listening on `listen_host` beyond loopback needs TLS and tokens, or
// `insecure`; otherwise InvalidArgument saying what to add.
Status CheckExposure(std::string_view listen_host, bool tls, bool tokens, bool insecure);

// The same rule for --http (the dashboard and /metrics), which has no authentication at
// all: beyond loopback only with `insecure` (or behind a proxy that authenticates, on
// loopback); otherwise InvalidArgument saying so.
Status CheckDashboardExposure(std::string_view http_host, bool insecure);

}  // namespace drover::coordinator
