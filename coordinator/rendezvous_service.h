// The RendezvousService of proto/drover.proto over a RendezvousStore, for every program
// that serves rendezvous: the coordinator (beside its other services, coordinator/server.h)
// and `drover train --nproc N`, which has no coordinator (RendezvousServer below).
//
// Handlers only translate: proto in, store call, grpc::Status out. A Wait occupies one RPC
// thread for up to its timeout (capped by RendezvousStore::kMaxWaitMs).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "coordinator/rendezvous.h"
#include "proto/drover.grpc.pb.h"

namespace drover::coordinator {

// Asked first by every handler with the call and its full method name; a status that is
// not OK is the answer (the coordinator's Authorizer). Must be thread-safe.
using CallGuard =
    std::function<grpc::Status(const grpc::ServerContextBase& ctx, std::string_view method)>;

// Thread-safe (the store is). `kv` is not owned and must outlive the service. Without a
// guard every call is served (`drover train --nproc` serves loopback only).
class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  explicit RendezvousServiceImpl(RendezvousStore* kv, CallGuard guard = nullptr)
      : kv_(kv), guard_(std::move(guard)) {}

  grpc::Status Set(grpc::ServerContext* ctx, const v1::KvSetRequest* req,
                   v1::KvSetResponse*) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::KvGetRequest* req,
                   v1::KvGetResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const v1::KvWaitRequest* req,
                    v1::KvWaitResponse*) override;
  grpc::Status Add(grpc::ServerContext* ctx, const v1::KvAddRequest* req,
                   v1::KvAddResponse* resp) override;
  grpc::Status ConfirmLease(grpc::ServerContext* ctx, const v1::LeaseRequest* req,
                            v1::LeaseResponse*) override;

 private:
  grpc::Status Guard(const grpc::ServerContext* ctx, std::string_view method) const {
    return guard_ ? guard_(*ctx, method) : grpc::Status::OK;
  }

  RendezvousStore* kv_;
  const CallGuard guard_;
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
