#include "coordinator/server.h"

#include <spdlog/spdlog.h>

#include "common/grpc_runtime.h"
#include "coordinator/agent_watch.h"
#include "coordinator/grpc_status.h"
#include "coordinator/rendezvous_service.h"
#include "coordinator/rpc_metrics.h"
#include "proto/drover.grpc.pb.h"

namespace drover::coordinator {

class HeartbeatServer;

namespace {

// Full method names, as Authorizer::Check wants them (coordinator/auth.cc lists them all).
constexpr char kRegister[] = "/drover.v1.WorkerService/Register";
constexpr char kHeartbeat[] = "/drover.v1.WorkerService/Heartbeat";
constexpr char kReportTrainerExit[] = "/drover.v1.WorkerService/ReportTrainerExit";
constexpr char kAppendLogs[] = "/drover.v1.WorkerService/AppendLogs";
constexpr char kWatch[] = "/drover.v1.WorkerService/Watch";
constexpr char kSubmitJob[] = "/drover.v1.JobService/SubmitJob";
constexpr char kGetJob[] = "/drover.v1.JobService/GetJob";
constexpr char kListJobs[] = "/drover.v1.JobService/ListJobs";
constexpr char kCancelJob[] = "/drover.v1.JobService/CancelJob";
constexpr char kSuspendJob[] = "/drover.v1.JobService/SuspendJob";
constexpr char kResumeJob[] = "/drover.v1.JobService/ResumeJob";
constexpr char kSetPriority[] = "/drover.v1.JobService/SetPriority";
constexpr char kSetTimeLimit[] = "/drover.v1.JobService/SetTimeLimit";
constexpr char kCheckpointJob[] = "/drover.v1.JobService/CheckpointJob";
constexpr char kDeleteJob[] = "/drover.v1.JobService/DeleteJob";
constexpr char kListWorkers[] = "/drover.v1.JobService/ListWorkers";
constexpr char kUncordon[] = "/drover.v1.JobService/Uncordon";
constexpr char kCordon[] = "/drover.v1.JobService/Cordon";
constexpr char kReadLogs[] = "/drover.v1.JobService/ReadLogs";

// Returns the refusal from the enclosing handler when `auth` refuses the call.
#define DROVER_AUTHORIZE(auth, ctx, method) \
  if (grpc::Status denied = (auth)->Check(*(ctx), method); !denied.ok()) return denied

// A Watch stream refused before it starts: finishes at once with the refusal.
class RefusedWatch final : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  explicit RefusedWatch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Heartbeat, the one RPC every node sends every second, is served on the async API by one
// thread that polls its own completion queue and answers in the thread that read the
// request (HeartbeatServer below). The sync and callback APIs pass each call between a
// polling thread and a worker thread: 2.9 context switches and 6.4 syscalls per heartbeat,
// against 0.3 and 2.6 this way (tests/bench/heartbeat_bench.cc, 3,000 agents), and that
// dominated the coordinator's CPU at 10,000 nodes. One thread, because a second one on the
// same epoll set takes turns polling with the first through futexes (2.2 switches per
// heartbeat again); one answers 10,000 heartbeats a second in about half a core.
// Coordinator::Heartbeat never blocks on I/O, so it is safe there. The other methods are
// rare and may touch disk or wait; they stay sync.
// Watch, one long-lived stream per agent, is on the callback API (agent_watch.h).
class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_Watch<
          v1::WorkerService::WithAsyncMethod_Heartbeat<v1::WorkerService::Service>> {
 public:
  WorkerServiceImpl(Coordinator* c, AgentWatches* watches, const Authorizer* auth)
      : c_(c), watches_(watches), auth_(auth) {}
  grpc::ServerWriteReactor<v1::WatchEvent>* Watch(grpc::CallbackServerContext* ctx,
                                                  const v1::WatchRequest* req) override {
    if (grpc::Status denied = auth_->Check(*ctx, kWatch); !denied.ok()) {
      return new RefusedWatch(denied);
    }
    return watches_->Open(*req);
  }
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kRegister);
    auto r = c_->Register(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status ReportTrainerExit(grpc::ServerContext* ctx, const v1::TrainerExitRequest* req,
                                 v1::TrainerExitResponse*) override {
    DROVER_AUTHORIZE(auth_, ctx, kReportTrainerExit);
    return ToGrpcStatus(c_->ReportTrainerExit(*req));
  }
  grpc::Status AppendLogs(grpc::ServerContext* ctx, const v1::AppendLogsRequest* req,
                          v1::AppendLogsResponse*) override {
    DROVER_AUTHORIZE(auth_, ctx, kAppendLogs);
    return ToGrpcStatus(c_->AppendLogs(*req));
  }

 private:
  Coordinator* c_;
  AgentWatches* watches_;
  const Authorizer* auth_;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator* c, const Authorizer* auth) : c_(c), auth_(auth) {}
  grpc::Status SubmitJob(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req,
                         v1::SubmitJobResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kSubmitJob);
    auto r = c_->SubmitJob(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_job_id(*r);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req,
                      v1::JobInfo* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kGetJob);
    auto r = c_->GetJob(req->job_id());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kListJobs);
    *resp = c_->ListJobs(*req);
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req,
                         v1::CancelJobResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kCancelJob);
    auto r = c_->CancelJob(req->job_id());
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_state(*r);
    return grpc::Status::OK;
  }
  grpc::Status SuspendJob(grpc::ServerContext* ctx, const v1::SuspendJobRequest* req,
                          v1::SuspendJobResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kSuspendJob);
    auto r = c_->SuspendJob(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status ResumeJob(grpc::ServerContext* ctx, const v1::ResumeJobRequest* req,
                         v1::ResumeJobResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kResumeJob);
    auto r = c_->ResumeJob(req->job_id());
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_state(*r);
    return grpc::Status::OK;
  }
  grpc::Status SetPriority(grpc::ServerContext* ctx, const v1::SetPriorityRequest* req,
                           v1::SetPriorityResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kSetPriority);
    auto r = c_->SetPriority(req->job_id(), req->priority());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status SetTimeLimit(grpc::ServerContext* ctx, const v1::SetTimeLimitRequest* req,
                            v1::SetTimeLimitResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kSetTimeLimit);
    auto r = c_->SetTimeLimit(req->job_id(), req->minutes());
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status CheckpointJob(grpc::ServerContext* ctx, const v1::CheckpointJobRequest* req,
                             v1::CheckpointJobResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kCheckpointJob);
    auto r = c_->CheckpointJob(req->job_id());
    if (!r.ok()) return ToGrpcStatus(r.status());
    resp->set_after_step(*r);
    return grpc::Status::OK;
  }
  grpc::Status DeleteJob(grpc::ServerContext* ctx, const v1::DeleteJobRequest* req,
                         v1::DeleteJobResponse*) override {
    DROVER_AUTHORIZE(auth_, ctx, kDeleteJob);
    return ToGrpcStatus(c_->DeleteJob(req->job_id()));
  }
  grpc::Status ListWorkers(grpc::ServerContext* ctx, const v1::ListWorkersRequest* req,
                           v1::ListWorkersResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kListWorkers);
    *resp = c_->ListWorkers(*req);
    return grpc::Status::OK;
  }
  grpc::Status Uncordon(grpc::ServerContext* ctx, const v1::UncordonRequest* req,
                        v1::UncordonResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kUncordon);
    auto r = c_->Uncordon(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status Cordon(grpc::ServerContext* ctx, const v1::CordonRequest* req,
                      v1::CordonResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kCordon);
    auto r = c_->Cordon(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status ReadLogs(grpc::ServerContext* ctx, const v1::ReadLogsRequest* req,
                        v1::ReadLogsResponse* resp) override {
    DROVER_AUTHORIZE(auth_, ctx, kReadLogs);
    auto r = c_->ReadLogs(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }

 private:
  Coordinator* c_;
  const Authorizer* auth_;
};

#undef DROVER_AUTHORIZE

// One heartbeat call on the async API: it asks gRPC for the next Heartbeat on the queue;
// when one arrives it answers it and has a fresh HeartbeatCall ask for the next; once the
// answer is sent (or the server shuts down) it deletes itself.
class HeartbeatCall {
 public:
  HeartbeatCall(HeartbeatServer* server, WorkerServiceImpl* service,
                grpc::ServerCompletionQueue* cq, Coordinator* c, const Authorizer* auth)
      : server_(server), service_(service), c_(c), auth_(auth), responder_(&ctx_) {
    service_->RequestHeartbeat(&ctx_, &request_, &responder_, cq, cq, this);
  }

  // The completion of this call's last operation; `ok` false: the server is shutting down.
  void Proceed(bool ok);

 private:
  HeartbeatServer* const server_;
  WorkerServiceImpl* const service_;
  Coordinator* const c_;
  const Authorizer* const auth_;
  grpc::ServerContext ctx_;
  v1::HeartbeatRequest request_;
  v1::HeartbeatResponse response_;
  grpc::ServerAsyncResponseWriter<v1::HeartbeatResponse> responder_;
  bool answered_ = false;
};

}  // namespace

// The thread that polls the heartbeat queue, and the calls waiting on it.
class HeartbeatServer {
 public:
  HeartbeatServer(std::unique_ptr<grpc::ServerCompletionQueue> cq, WorkerServiceImpl* service,
                  Coordinator* c, const Authorizer* auth)
      : cq_(std::move(cq)), service_(service), c_(c), auth_(auth) {}

  // Once the server is built: a few calls waiting, so a burst does not wait for the next
  // to be asked for, and the polling thread.
  void Start() {
    for (int i = 0; i < 8; ++i) AskForNext();
    thread_ = std::thread([this] {
      void* tag = nullptr;
      bool ok = false;
      while (cq_->Next(&tag, &ok)) static_cast<HeartbeatCall*>(tag)->Proceed(ok);
    });
  }

  void AskForNext() {
    // Never after the queue is shut down (gRPC aborts on that); the lock orders the two.
    MutexLock lock(&mu_);
    if (!stopped_) new HeartbeatCall(this, service_, cq_.get(), c_, auth_);
  }

  // After the grpc::Server's Shutdown: the queue then hands back every call still waiting
  // (ok false), and the thread ends once it is drained. Idempotent.
  void Stop() {
    {
      MutexLock lock(&mu_);
      if (stopped_) return;
      stopped_ = true;
      cq_->Shutdown();
    }
    if (thread_.joinable()) {
      thread_.join();
    } else {  // never started: drain here
      void* tag = nullptr;
      bool ok = false;
      while (cq_->Next(&tag, &ok)) static_cast<HeartbeatCall*>(tag)->Proceed(ok);
    }
  }
  ~HeartbeatServer() { Stop(); }

 private:
  const std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  WorkerServiceImpl* const service_;
  Coordinator* const c_;
  const Authorizer* const auth_;
  Mutex mu_;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

namespace {

void HeartbeatCall::Proceed(bool ok) {
  if (answered_ || !ok) {
    delete this;
    return;
  }
  server_->AskForNext();
  answered_ = true;
  if (grpc::Status denied = auth_->Check(ctx_, kHeartbeat); !denied.ok()) {
    responder_.FinishWithError(denied, this);
    return;
  }
  response_ = c_->Heartbeat(request_);
  responder_.Finish(response_, grpc::Status::OK, this);
}

// Plaintext, or TLS with the coordinator's certificate that asks every client for a
// certificate and verifies any it gets. Asking, not requiring: the CLI may come with a
// token and no certificate; agents are held to theirs per call (Authorizer).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsCredentials& tls) {
  if (!tls.enabled) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = tls.ca_pem;
  ssl.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* coordinator, const std::string& listen, int64_t tick_ms,
    CoordinatorMetrics* rpc_metrics, ServerSecurity security) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return InvalidArgumentError("--listen must be host:port, got '" + listen + "'");
  }
  TuneGrpcRuntime();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->coordinator_ = coordinator;
  s->host_ = listen.substr(0, colon);
  s->authorizer_ = std::make_unique<Authorizer>(AuthPolicy{
      .require_client_cert = security.tls.enabled, .tokens = std::move(security.tokens)});
  const Authorizer* auth = s->authorizer_.get();
  s->watches_ = std::make_unique<AgentWatches>(coordinator);
  coordinator->SetNudge([w = s->watches_.get()](const std::string& node) { w->Nudge(node); });
  s->worker_service_ = std::make_unique<WorkerServiceImpl>(coordinator, s->watches_.get(), auth);
  s->job_service_ = std::make_unique<JobServiceImpl>(coordinator, auth);
  s->rendezvous_service_ = std::make_unique<RendezvousServiceImpl>(
      &coordinator->rendezvous(),
      [auth](const grpc::ServerContextBase& ctx, std::string_view method) {
        return auth->Check(ctx, method);
      });
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, ServerCredentials(security.tls), &s->port_);
  builder.RegisterService(s->worker_service_.get());
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->rendezvous_service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  if (rpc_metrics != nullptr) {
    builder.experimental().SetInterceptorCreators(RpcMetricsInterceptors(rpc_metrics));
  }
  // Bandwidth-delay probing sends a PING with every read that finds no probe in flight:
  // on thousands of connections that each carry one small heartbeat a second, that doubled
  // the coordinator's packets and CPU. Messages here are small; the default window is ample.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto* service = static_cast<WorkerServiceImpl*>(s->worker_service_.get());
  s->heartbeats_ =
      std::make_unique<HeartbeatServer>(builder.AddCompletionQueue(), service, coordinator, auth);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return UnavailableError("cannot listen on " + listen +
                            (security.tls.enabled
                                 ? " (address in use or invalid, or gRPC refused the TLS "
                                   "certificate, key or CA: see the log above)"
                                 : " (address in use or invalid)"));
  }
  s->heartbeats_->Start();
  // Trainers dial this for rendezvous. A wildcard bind names no address another node can
  // dial, so none is advertised: each agent then hands its trainers the address it reaches
  // the coordinator by itself (worker/agent.cc), which is right on every node. main's
  // --advertise overrides both.
  const bool wildcard = s->host_ == "0.0.0.0" || s->host_ == "[::]" || s->host_ == "::";
  coordinator->SetAdvertisedAddress(wildcard ? "" : s->host_ + ":" + std::to_string(s->port_));
  s->ticker_ = std::thread([raw = s.get(), tick_ms] { raw->RunTicker(tick_ms); });
  spdlog::info("coordinator listening on {}{}{}", s->address(),
               security.tls.enabled ? " (mutual TLS)" : " (plaintext)",
               auth->policy().tokens.empty() ? "" : ", JobService needs a token");
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::RunTicker(int64_t tick_ms) {
  MutexLock lock(&mu_);
  while (!stop_) {
    lock.Unlock();
    coordinator_->Tick();
    lock.Lock();
    stop_cv_.WaitFor(&mu_, std::chrono::milliseconds(tick_ms),
                     [this]() REQUIRES(mu_) { return stop_; });
  }
}

void CoordinatorServer::Shutdown() {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  stop_cv_.SignalAll();
  if (ticker_.joinable()) ticker_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (heartbeats_) heartbeats_->Stop();
  if (coordinator_) coordinator_->SetNudge(nullptr);
}

}  // namespace drover::coordinator
