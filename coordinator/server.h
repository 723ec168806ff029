// CoordinatorServer: gRPC in front of a Coordinator (WorkerService, JobService,
// RendezvousService of proto/drover.proto) plus the ticker thread that drives health
// checks and scheduling.
//
// Handlers only translate: proto in, Coordinator call, grpc::Status out (one helper maps
// drover Status codes). Blocking rendezvous waits occupy one RPC thread each, bounded by
// their timeout.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/tls.h"
#include "coordinator/authorizer.h"
#include "coordinator/coordinator.h"
#include "coordinator/metrics.h"
#include "coordinator/tokens.h"

namespace drover::coordinator {

class AgentWatches;
class HeartbeatServer;

// How the server lets callers in (coordinator/auth.h). The default is today's loopback
// set-up: plaintext, no checks.
struct ServerSecurity {
  // Enabled: the port speaks TLS only, with the coordinator's certificate, and asks every
  // client for a certificate signed by tls.ca_pem; agents and trainers must present one.
  TlsCredentials tls;
  // Not empty: JobService calls need one of these bearer tokens.
  std::vector<TokenEntry> tokens;
};

class CoordinatorServer {
 public:
  // Binds `listen` (host:port; port 0 picks a free one), starts serving and ticking every
  // tick_ms. `coordinator` must outlive the server, and so must `rpc_metrics` when given:
  // every RPC is then counted and timed there (rpc_metrics.h). `security`: who may call
  // (ServerSecurity above; the default checks nobody).
  static StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      Coordinator* coordinator, const std::string& listen, int64_t tick_ms = 100,
      CoordinatorMetrics* rpc_metrics = nullptr, ServerSecurity security = {});
  ~CoordinatorServer();  // Shutdown()

  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }

  // Stops accepting RPCs, waits briefly for those in flight, stops the ticker. Idempotent.
  void Shutdown();

 private:
  CoordinatorServer() = default;
  void RunTicker(int64_t tick_ms);

  Coordinator* coordinator_ = nullptr;
  std::string host_;
  int port_ = 0;
  // Declared before the services that ask it.
  std::unique_ptr<Authorizer> authorizer_;
  // Declared before server_: the streams it owns call it until the server is gone.
  std::unique_ptr<AgentWatches> watches_;
  std::unique_ptr<grpc::Service> worker_service_;
  std::unique_ptr<grpc::Service> job_service_;
  std::unique_ptr<grpc::Service> rendezvous_service_;
  // Heartbeat is served on the async API by one thread polling its own completion queue
  // (server.cc says why one). Declared before server_: its queue must outlive the server.
  std::unique_ptr<HeartbeatServer> heartbeats_;
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  CondVar stop_cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

}  // namespace drover::coordinator
