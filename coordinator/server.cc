#include "coordinator/server.h"

#include <spdlog/spdlog.h>

#include "common/grpc_runtime.h"
#include "proto/drover.grpc.pb.h"

namespace drover::coordinator {
namespace {

// Heartbeat, the one RPC every node sends every second, runs on gRPC's callback API: the
// handler runs on the thread that read the request, with no hand-off to a sync-server
// worker thread (whose pool grows and shrinks with load), which measured ~2x cheaper per
// call (tests/bench/heartbeat_bench.cc). Coordinator::Heartbeat never blocks on I/O, so it
// is safe on those threads. The other methods are rare and may touch disk; they stay sync.
class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_Heartbeat<v1::WorkerService::Service> {
 public:
  explicit WorkerServiceImpl(Coordinator* c) : c_(c) {}
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    auto r = c_->Register(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override {
    *resp = c_->Heartbeat(*req);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::Status ReportTrainerExit(grpc::ServerContext*, const v1::TrainerExitRequest* req,
                                 v1::TrainerExitResponse*) override {
    return ToGrpcStatus(c_->ReportTrainerExit(*req));
  }
  grpc::Status AppendLogs(grpc::ServerContext*, const v1::AppendLogsRequest* req,
                          v1::AppendLogsResponse*) override {
    return ToGrpcStatus(c_->AppendLogs(*req));
  }

 private:
  Coordinator* c_;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  explicit JobServiceImpl(Coordinator* c) : c_(c) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    auto r = c_->SubmitJob(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_job_id(*r);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                      v1::JobInfo* resp) override {
    auto r = c_->GetJob(req->job_id());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse* resp) override {
    *resp = c_->ListJobs();
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req,
                         v1::CancelJobResponse* resp) override {
    auto r = c_->CancelJob(req->job_id());
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_state(*r);
    return grpc::Status::OK;
  }
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* resp) override {
    *resp = c_->ListWorkers();
    return grpc::Status::OK;
  }
  grpc::Status ReadLogs(grpc::ServerContext*, const v1::ReadLogsRequest* req,
                        v1::ReadLogsResponse* resp) override {
    auto r = c_->ReadLogs(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }

 private:
  Coordinator* c_;
};

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  explicit RendezvousServiceImpl(RendezvousStore* kv) : kv_(kv) {}
  grpc::Status Set(grpc::ServerContext*, const v1::KvSetRequest* req, v1::KvSetResponse*) override {
    const auto& k = req->key();
    return ToGrpcStatus(kv_->Set(k.job_id(), k.attempt(), k.key(), req->value()));
  }
  grpc::Status Get(grpc::ServerContext*, const v1::KvGetRequest* req,
                   v1::KvGetResponse* resp) override {
    const auto& k = req->key();
    auto r = kv_->Get(k.job_id(), k.attempt(), k.key());
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_found(r->has_value());
    if (r->has_value()) resp->set_value(**r);
    return grpc::Status::OK;
  }
  grpc::Status Wait(grpc::ServerContext*, const v1::KvWaitRequest* req,
                    v1::KvWaitResponse*) override {
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    return ToGrpcStatus(kv_->Wait(req->job_id(), req->attempt(), keys, req->timeout_ms()));
  }
  grpc::Status Add(grpc::ServerContext*, const v1::KvAddRequest* req,
                   v1::KvAddResponse* resp) override {
    const auto& k = req->key();
    auto r = kv_->Add(k.job_id(), k.attempt(), k.key(), req->delta());
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_value(*r);
    return grpc::Status::OK;
  }

 private:
  RendezvousStore* kv_;
};

}  // namespace

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // drover's codes are numbered like gRPC's (common/status.h), so the cast is exact.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(Coordinator* coordinator,
                                                                      const std::string& listen,
                                                                      int64_t tick_ms) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgumentError("--listen must be host:port, got '" + listen + "'");
  }
  TuneGrpcRuntime();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->coordinator_ = coordinator;
  s->host_ = listen.substr(0, colon);
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(coordinator);
  s->job_service_ = std::make_unique<JobServiceImpl>(coordinator);
  s->rendezvous_service_ = std::make_unique<RendezvousServiceImpl>(&coordinator->rendezvous());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->worker_service_.get());
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->rendezvous_service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  // Bandwidth-delay probing sends a PING with every read that finds no probe in flight:
  // on thousands of connections that each carry one small heartbeat a second, that doubled
  // the coordinator's packets and CPU. Messages here are small; the default window is ample.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return UnavailableError("cannot listen on " + listen + " (address in use or invalid)");
  }
  // Trainers dial this for rendezvous. A wildcard bind names no address another node can
  // dial, so none is advertised: each agent then hands its trainers the address it reaches
  // the coordinator by itself (worker/agent.cc), which is right on every node. main's
  // --advertise overrides both.
  const bool wildcard = s->host_ == "0.0.0.0" || s->host_ == "[::]" || s->host_ == "::";
  coordinator->SetAdvertisedAddress(wildcard ? "" : s->host_ + ":" + std::to_string(s->port_));
  s->ticker_ = std::thread([raw = s.get(), tick_ms] { raw->RunTicker(tick_ms); });
  spdlog::info("coordinator listening on {}", s->address());
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::RunTicker(int64_t tick_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    coordinator_->Tick();
    lock.lock();
    stop_cv_.wait_for(lock, std::chrono::milliseconds(tick_ms), [&] { return stop_; });
  }
}

void CoordinatorServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace drover::coordinator
