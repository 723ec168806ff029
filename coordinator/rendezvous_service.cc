#include "coordinator/rendezvous_service.h"

#include <chrono>
#include <vector>

#include "common/grpc_runtime.h"
#include "coordinator/grpc_status.h"

namespace drover::coordinator {

grpc::Status RendezvousServiceImpl::Set(grpc::ServerContext* ctx, const v1::KvSetRequest* req,
                                        v1::KvSetResponse*) {
  if (grpc::Status denied = Guard(ctx, "/drover.v1.RendezvousService/Set"); !denied.ok()) {
    return denied;
  }
  const auto& k = req->key();
  return ToGrpcStatus(kv_->Set(k.job_id(), k.attempt(), k.key(), req->value()));
}

grpc::Status RendezvousServiceImpl::ConfirmLease(grpc::ServerContext* ctx,
                                                 const v1::LeaseRequest* req, v1::LeaseResponse*) {
  if (grpc::Status denied = Guard(ctx, "/drover.v1.RendezvousService/ConfirmLease"); !denied.ok()) {
    return denied;
  }
  return ToGrpcStatus(kv_->ConfirmLease(req->job_id(), req->attempt()));
}

grpc::Status RendezvousServiceImpl::Get(grpc::ServerContext* ctx, const v1::KvGetRequest* req,
                                        v1::KvGetResponse* resp) {
  if (grpc::Status denied = Guard(ctx, "/drover.v1.RendezvousService/Get"); !denied.ok()) {
    return denied;
  }
  const auto& k = req->key();
  auto r = kv_->Get(k.job_id(), k.attempt(), k.key());
  if (!r.ok()) return ToGrpcStatus(r.status());
  resp->set_found(r->has_value());
  if (r->has_value()) resp->set_value(**r);
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::Wait(grpc::ServerContext* ctx, const v1::KvWaitRequest* req,
                                         v1::KvWaitResponse*) {
  if (grpc::Status denied = Guard(ctx, "/drover.v1.RendezvousService/Wait"); !denied.ok()) {
    return denied;
  }
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  return ToGrpcStatus(kv_->Wait(req->job_id(), req->attempt(), keys, req->timeout_ms()));
}

grpc::Status RendezvousServiceImpl::Add(grpc::ServerContext* ctx, const v1::KvAddRequest* req,
                                        v1::KvAddResponse* resp) {
  if (grpc::Status denied = Guard(ctx, "/drover.v1.RendezvousService/Add"); !denied.ok()) {
    return denied;
  }
  const auto& k = req->key();
  auto r = kv_->Add(k.job_id(), k.attempt(), k.key(), req->delta());
  if (!r.ok()) return ToGrpcStatus(r.status());
  resp->set_value(*r);
  return grpc::Status::OK;
}

StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(RendezvousStore* store,
                                                                    const std::string& host,
                                                                    int port) {
  TuneGrpcRuntime();
  std::unique_ptr<RendezvousServer> s(new RendezvousServer(store, host));
  const std::string listen = host + ":" + std::to_string(port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(&s->service_);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return UnavailableError("cannot listen on " + listen + " (address in use or invalid)");
  }
  return s;
}

RendezvousServer::~RendezvousServer() { Shutdown(); }

void RendezvousServer::Shutdown() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace drover::coordinator
