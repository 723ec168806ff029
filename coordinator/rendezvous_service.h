// The RendezvousService of proto/drover.proto over a RendezvousStore, for every program
// that serves rendezvous: the coordinator (beside its other services, coordinator/server.h)
// and `drover train --nproc N`, which has no coordinator (RendezvousServer below).
//
// Handlers only translate: proto in, store call, grpc::Status out. A Wait occupies one RPC
// thread for up to its timeout (capped by RendezvousStore::kMaxWaitMs).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "coordinator/rendezvous.h"
#include "proto/drover.grpc.pb.h"

namespace drover::coordinator {

// Thread-safe (the store is). `kv` is not owned and must outlive the service.
class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  explicit RendezvousServiceImpl(RendezvousStore* kv) : kv_(kv) {}

  grpc::Status Set(grpc::ServerContext*, const v1::KvSetRequest* req, v1::KvSetResponse*) override;
  grpc::Status Get(grpc::ServerContext*, const v1::KvGetRequest* req,
                   v1::KvGetResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext*, const v1::KvWaitRequest* req,
                    v1::KvWaitResponse*) override;
  grpc::Status Add(grpc::ServerContext*, const v1::KvAddRequest* req,
                   v1::KvAddResponse* resp) override;

 private:
  RendezvousStore* kv_;
};

// A gRPC server with the RendezvousService alone. `store` is not owned and must outlive
// the server; the caller opens the attempts it wants served.
class RendezvousServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving. Unavailable when the
  // address cannot be bound.
  static StatusOr<std::unique_ptr<RendezvousServer>> Start(RendezvousStore* store,
                                                           const std::string& host, int port = 0);
  ~RendezvousServer();  // Shutdown()

  // host:port, with the port actually bound: what trainers get as DROVER_COORDINATOR.
  std::string address() const { return host_ + ":" + std::to_string(port_); }

  // Stops accepting RPCs and returns once the calls in flight have ended. A Wait holds its
  // thread until the store wakes it, whatever the client does: close the attempts first
  // (RendezvousStore::CloseAttempt), or this blocks until those waits time out. Idempotent.
  void Shutdown();

 private:
  RendezvousServer(RendezvousStore* store, std::string host)
      : service_(store), host_(std::move(host)) {}

  RendezvousServiceImpl service_;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace drover::coordinator
