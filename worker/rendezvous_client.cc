#include "worker/rendezvous_client.h"

#include "worker/grpc_util.h"

namespace drover {

RendezvousClient::RendezvousClient(const std::string& coordinator, std::string job_id,
                                   int64_t attempt, int64_t rpc_timeout_ms,
                                   const TlsCredentials& tls)
    : address_(coordinator),
      job_id_(std::move(job_id)),
      attempt_(attempt),
      rpc_timeout_ms_(rpc_timeout_ms),
      tls_(tls),
      stub_(v1::RendezvousService::NewStub(MakeChannel(coordinator, tls))) {}

std::shared_ptr<RendezvousClient::Stub> RendezvousClient::stub() {
  MutexLock lock(&mu_);
  return stub_;
}

Status RendezvousClient::Checked(const std::shared_ptr<Stub>& used, Status result) {
  if (result.code() != StatusCode::kUnavailable) return result;
  std::shared_ptr<Stub> fresh = v1::RendezvousService::NewStub(MakeChannel(address_, tls_));
  MutexLock lock(&mu_);
  // Another thread's failed call may have replaced it already: keep that one.
  if (stub_ == used) stub_ = std::move(fresh);
  return result;
}

v1::KvKey RendezvousClient::Key(const std::string& key) const {
  v1::KvKey k;
  k.set_job_id(job_id_);
  k.set_attempt(attempt_);
  k.set_key(key);
  return k;
}

Status RendezvousClient::Set(const std::string& key, const std::string& value) {
  v1::KvSetRequest req;
  *req.mutable_key() = Key(key);
  req.set_value(value);
  v1::KvSetResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, rpc_timeout_ms_);
  const std::shared_ptr<Stub> stub = this->stub();
  return Checked(stub, FromGrpcStatus(stub->Set(&ctx, req, &resp), "rendezvous Set '" + key + "'"));
}

Status RendezvousClient::ConfirmLease() {
  v1::LeaseRequest req;
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  v1::LeaseResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, rpc_timeout_ms_);
  const std::shared_ptr<Stub> stub = this->stub();
  return Checked(stub,
                 FromGrpcStatus(stub->ConfirmLease(&ctx, req, &resp), "rendezvous ConfirmLease"));
}

StatusOr<std::optional<std::string>> RendezvousClient::Get(const std::string& key) {
  v1::KvGetRequest req;
  *req.mutable_key() = Key(key);
  v1::KvGetResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, rpc_timeout_ms_);
  const std::shared_ptr<Stub> stub = this->stub();
  RETURN_IF_ERROR(
      Checked(stub, FromGrpcStatus(stub->Get(&ctx, req, &resp), "rendezvous Get '" + key + "'")));
  if (!resp.found()) return std::optional<std::string>();
  return std::optional<std::string>(resp.value());
}

Status RendezvousClient::Wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
  v1::KvWaitRequest req;
  req.set_job_id(job_id_);
  req.set_attempt(attempt_);
  for (const std::string& k : keys) req.add_keys(k);
  req.set_timeout_ms(static_cast<int32_t>(timeout_ms));
  v1::KvWaitResponse resp;
  grpc::ClientContext ctx;
  // The server answers DEADLINE_EXCEEDED itself at timeout_ms; the RPC deadline only
  // guards against a coordinator that never answers.
  SetDeadlineMs(&ctx, timeout_ms + rpc_timeout_ms_);
  const std::shared_ptr<Stub> stub = this->stub();
  return Checked(stub, FromGrpcStatus(stub->Wait(&ctx, req, &resp), "rendezvous Wait"));
}

StatusOr<int64_t> RendezvousClient::Add(const std::string& key, int64_t delta) {
  v1::KvAddRequest req;
  *req.mutable_key() = Key(key);
  req.set_delta(delta);
  v1::KvAddResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, rpc_timeout_ms_);
  const std::shared_ptr<Stub> stub = this->stub();
  RETURN_IF_ERROR(
      Checked(stub, FromGrpcStatus(stub->Add(&ctx, req, &resp), "rendezvous Add '" + key + "'")));
  return resp.value();
}

StatusOr<std::string> RendezvousClient::WaitGet(const std::string& key, int64_t timeout_ms) {
  RETURN_IF_ERROR(Wait({key}, timeout_ms));
  ASSIGN_OR_RETURN(std::optional<std::string> value, Get(key));
  if (!value.has_value()) return NotFoundError("rendezvous key '" + key + "' vanished");
  return *value;
}

}  // namespace drover
