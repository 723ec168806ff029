#include "worker/agent.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <random>
#include <span>

#include "common/attempt_lease_ms.h"
#include "common/files.h"
#include "common/net.h"
#include "common/protocol_version.h"
#include "worker/call_within.h"
#include "worker/grpc_util.h"
#include "worker/process.h"
#include "worker/trainer_env.h"

namespace drover {
namespace {

// After a trainer exit: heartbeats every kFastHeartbeatMs for kFastHeartbeatWindowMs.
constexpr int64_t kFastHeartbeatMs = 100;
constexpr int64_t kFastHeartbeatWindowMs = 3000;

std::string MakeAgentId(const std::string& name) {
  std::random_device rd;
  char suffix[17];
  snprintf(suffix, sizeof(suffix), "%08x%08x", rd(), rd());
  return name + "-" + std::to_string(getpid()) + "-" + suffix;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// What the node registers as its address when --address is not given: on a cluster
// network, the one its trainers accept peers on (trainer_env.cc computes it alike), so that
// `drover workers` shows what peers dial; with a coordinator on loopback, the host name.
std::string AdvertisedAddress(const std::string& coordinator) {
  if (IsLoopbackHost(HostOfAddress(coordinator))) return HostName();
  StatusOr<std::string> local = LocalAddressToward(coordinator);
  return local.ok() ? *local : HostName();
}

std::string AttemptDir(const std::string& root, const std::string& job, int64_t attempt) {
  return root + "/" + job + "/attempt-" + std::to_string(attempt);
}

}  // namespace

StatusOr<v1::DeviceKind> ParseDeviceKind(const std::string& device) {
  if (device == "cpu") return v1::CPU;
  if (device == "cuda") return v1::CUDA;
  return InvalidArgumentError("--device '" + device + "' is not valid; use cpu or cuda");
}

Agent::Agent(AgentOptions options, const Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      agent_id_(MakeAgentId(options_.name)),
      stub_(v1::WorkerService::NewStub(MakeChannel(options_.coordinator, options_.tls))) {
  if (options_.heartbeat_interval_ms > 0) heartbeat_interval_ms_ = options_.heartbeat_interval_ms;
  logs_ = std::make_unique<LogShipper>([this](const v1::AppendLogsRequest& req) {
    v1::AppendLogsResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, options_.rpc_timeout_ms);
    return FromGrpcStatus(stub()->AppendLogs(&ctx, req, &resp), "AppendLogs");
  });
  // A checkpoint record goes to the coordinator at once (Wake: a heartbeat now), as an exit
  // does: a recovery resumes from the newest checkpoint the coordinator knows.
  supervisor_ = std::make_unique<TrainerSupervisor>(
      clock_, [this](const v1::TrainerStatus& st) { OnTrainerExit(st); },
      options_.exited_retention_ms, [this] { Wake(); });
  logs_->Start();
}

std::shared_ptr<v1::WorkerService::Stub> Agent::stub() {
  MutexLock lock(&mu_);
  return stub_;
}

void Agent::ResetChannel() {
  std::shared_ptr<v1::WorkerService::Stub> fresh =
      v1::WorkerService::NewStub(MakeChannel(options_.coordinator, options_.tls));
  MutexLock lock(&mu_);
  stub_ = std::move(fresh);
}

Agent::~Agent() {
  watch_.reset();
  supervisor_.reset();
  logs_.reset();
}

void Agent::Shutdown() {
  {
    MutexLock lock(&mu_);
    shutdown_ = true;
  }
  cv_.SignalAll();
}

void Agent::SleepMs(int64_t ms) {
  MutexLock lock(&mu_);
  // A trainer exit ends the wait: the loop heartbeats at the fast cadence from then on.
  // While draining, the loop goes on until the trainers are gone, waking for each exit.
  cv_.WaitFor(&mu_, std::chrono::milliseconds(ms),
              [this]() REQUIRES(mu_) { return (shutdown_ && !draining_) || wake_; });
  wake_ = false;
}

void Agent::Wake() {
  {
    MutexLock lock(&mu_);
    wake_ = true;
  }
  cv_.SignalAll();
}

Status Agent::Register() {
  v1::RegisterRequest req;
  req.set_name(options_.name);
  req.set_address(options_.address.empty() ? AdvertisedAddress(options_.coordinator)
                                           : options_.address);
  req.set_agent_id(agent_id_);
  req.set_node_uid(options_.node_uid);
  req.set_protocol_version(kProtocolVersion);
  for (int i = 0; i < options_.slots; ++i) {
    v1::Slot* slot = req.add_slots();
    slot->set_index(i);
    slot->set_device(options_.device);
    std::string what = "cpu";
    if (options_.device == v1::CUDA) {
      what = i < static_cast<int>(options_.gpus.size())
                 ? GpuSlotDescription(i, options_.gpus[static_cast<size_t>(i)])
                 : "cuda:" + std::to_string(i);
    }
    slot->set_description(what);
  }
  req.set_seq(++seq_);
  for (const v1::TrainerStatus& st : supervisor_->Snapshot()) *req.add_running() = st;
  AddGpuHealth(req.mutable_unhealthy_slots());
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, options_.rpc_timeout_ms);
  RETURN_IF_ERROR(
      FromGrpcStatus(stub()->Register(&ctx, req, &resp), "Register with " + options_.coordinator));
  if (options_.heartbeat_interval_ms <= 0 && resp.heartbeat_interval_ms() > 0) {
    heartbeat_interval_ms_ = resp.heartbeat_interval_ms();
  }
  if (resp.heartbeat_timeout_ms() > 0) node_timeout_ms_ = resp.heartbeat_timeout_ms();
  spdlog::info("registered as {} (agent {}) with {}, {} slot(s), heartbeat every {} ms",
               options_.name, agent_id_, options_.coordinator, options_.slots,
               heartbeat_interval_ms_);
  return OkStatus();
}

Status Agent::Heartbeat() {
  v1::HeartbeatRequest req;
  req.set_name(options_.name);
  req.set_agent_id(agent_id_);
  req.set_seq(++seq_);
  {
    MutexLock lock(&mu_);
    req.set_draining(draining_);
  }
  for (const v1::TrainerStatus& st : supervisor_->Snapshot()) *req.add_trainers() = st;
  std::vector<v1::CheckpointRecord> pending = supervisor_->PendingCheckpoints();
  for (const v1::CheckpointRecord& c : pending) *req.add_checkpoints() = c;
  AddGpuHealth(req.mutable_unhealthy_slots());
  if (gpu_health_) {
    for (v1::GpuTelemetry& t : gpu_health_->Telemetry()) *req.add_gpus() = std::move(t);
  }
  v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, options_.rpc_timeout_ms);
  RETURN_IF_ERROR(
      FromGrpcStatus(stub()->Heartbeat(&ctx, req, &resp), "Heartbeat to " + options_.coordinator));
  supervisor_->AckCheckpoints(pending.size());
  for (const v1::Order& order : resp.orders()) {
    if (order.has_start()) StartTrainer(order.start());
    if (order.has_stop()) {
      const v1::StopTrainersOrder& stop = order.stop();
      spdlog::info("stopping trainers of job {} attempt <= {} ({})", stop.job_id(), stop.attempt(),
                   stop.reason());
      supervisor_->Stop(stop.job_id(), stop.attempt(), stop.grace_ms());
    }
    if (order.has_drain()) {
      const int grace =
          order.drain().grace_ms() > 0 ? order.drain().grace_ms() : options_.shutdown_grace_ms;
      if (const int n = supervisor_->DrainRunning(grace); n > 0) {
        spdlog::info("draining {} trainer(s): a checkpoint each, within {} ms ({})", n, grace,
                     order.drain().reason());
      }
    }
    if (order.has_checkpoint()) {
      const v1::CheckpointTrainersOrder& c = order.checkpoint();
      const int n = supervisor_->RequestCheckpoint(c.job_id(), c.attempt(), c.request_id());
      if (n > 0) {
        spdlog::info("asked {} trainers of job {} attempt {} for a checkpoint ({})", n, c.job_id(),
                     c.attempt(), c.reason());
      }
    }
  }
  if (gpu_health_ && !resp.cleared_latches().empty()) {
    gpu_health_->ClearLatches(
        std::span<const int64_t>(resp.cleared_latches().data(), resp.cleared_latches().size()));
  }
  if (resp.reregister()) return AbortedError("coordinator asked to register again");
  return OkStatus();
}

void Agent::AddGpuHealth(google::protobuf::RepeatedPtrField<v1::SlotHealth>* out) {
  if (!gpu_health_) return;
  std::vector<v1::SlotHealth> unfit = gpu_health_->Unfit();
  auto in = [](const std::vector<v1::SlotHealth>& list, const v1::SlotHealth& h) {
    return std::any_of(list.begin(), list.end(), [&](const v1::SlotHealth& x) {
      return x.slot() == h.slot() && x.fault() == h.fault();
    });
  };
  for (const v1::SlotHealth& h : unfit) {
    if (!in(unhealthy_, h)) spdlog::warn("slot {} is unfit for training: {}", h.slot(), h.fault());
  }
  for (const v1::SlotHealth& h : unhealthy_) {
    // A latch (an Xid) ends by an operator's uncordon, which the monitor logged, not by a
    // check that passed.
    if (h.latch() != 0) continue;
    if (std::none_of(unfit.begin(), unfit.end(),
                     [&](const v1::SlotHealth& x) { return x.slot() == h.slot(); })) {
      spdlog::info("slot {}: its GPU passes the health check again", h.slot());
    }
  }
  unhealthy_ = std::move(unfit);
  for (const v1::SlotHealth& h : unhealthy_) *out->Add() = h;
}

void Agent::StartTrainer(const v1::StartTrainerOrder& order) {
  TrainerKey key{order.job_id(), order.attempt(), order.rank()};
  if (supervisor_->Has(key)) return;  // a repeated order
  const std::string job_dir = AttemptDir(options_.work_dir + "/jobs", key.job_id, key.attempt);
  const std::string spec_path = job_dir + "/job.yaml";
  const std::string log_path = AttemptDir(options_.work_dir + "/logs", key.job_id, key.attempt) +
                               "/rank-" + std::to_string(key.rank) + ".log";
  Status st = MakeDirs(job_dir);
  if (st.ok()) st = WriteFileAtomic(spec_path, order.spec_yaml());
  if (!st.ok()) {
    // The trainer cannot start without its spec; launching it anyway lets it fail the
    // usual way (an exit the coordinator sees) instead of silently never starting.
    spdlog::error("job {} rank {}: {}", key.job_id, key.rank, st.ToString());
  }
  TrainerLaunch launch;
  launch.key = key;
  launch.spawn.executable = options_.trainer_path;
  launch.spawn.log_path = log_path;
  const std::string coordinator =
      order.coordinator_address().empty() ? options_.coordinator : order.coordinator_address();
  launch.spawn.env = {
      {kEnvCoordinator, coordinator},
      {kEnvJobId, key.job_id},
      {kEnvAttempt, std::to_string(key.attempt)},
      {kEnvRank, std::to_string(key.rank)},
      {kEnvWorldSize, std::to_string(order.world_size())},
      {kEnvLocalRank, std::to_string(order.local_rank())},
      {kEnvSlot, std::to_string(order.slot())},
      {kEnvSpecPath, spec_path},
      {kEnvResume, order.resume_checkpoint()},
      {kEnvThreads, std::to_string(std::max(1, order.threads()))},
  };
  // The trainer's lease on its attempt lapses well before the coordinator can declare this
  // node dead and start another attempt (split brain: worker/attempt_lease.h).
  launch.spawn.env.emplace_back(kEnvLeaseMs, std::to_string(AttemptLeaseMs(node_timeout_ms_)));
  if (order.device() == v1::CUDA) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    launch.spawn.env.emplace_back("CUDA_VISIBLE_DEVICES",
                                  VisibleDeviceForSlot(order.slot(), visible ? visible : ""));
  }
  // The trainer dials rendezvous as this agent does: with its cluster certificate. Set
  // even when empty, so that none is inherited from the agent's own environment.
  launch.spawn.env.emplace_back(kEnvTlsCert, options_.tls_files.cert);
  launch.spawn.env.emplace_back(kEnvTlsKey, options_.tls_files.key);
  launch.spawn.env.emplace_back(kEnvTlsCa, options_.tls_files.ca);
  // An address given to the agent is one its peers can reach: its trainers accept there.
  if (!options_.address.empty()) launch.spawn.env.emplace_back(kEnvBindAddress, options_.address);
  logs_->Add(key, log_path);
  spdlog::info("starting trainer job {} attempt {} rank {}/{} slot {}{}", key.job_id, key.attempt,
               key.rank, order.world_size(), order.slot(),
               order.resume_checkpoint().empty() ? "" : " from " + order.resume_checkpoint());
  Status started = supervisor_->Start(launch);
  if (!started.ok()) spdlog::error("job {} rank {}: {}", key.job_id, key.rank, started.ToString());
}

void Agent::OnTrainerExit(const v1::TrainerStatus& status) {
  logs_->Finish(TrainerKey{status.job_id(), status.attempt(), status.rank()});
  spdlog::info("trainer job {} attempt {} rank {} (pid {}) exited: {}", status.job_id(),
               status.attempt(), status.rank(), status.pid(),
               DescribeWaitStatus(status.exit_code(), status.signal()));
  {
    MutexLock lock(&mu_);
    fast_until_ms_ = clock_->NowMs() + kFastHeartbeatWindowMs;
    wake_ = true;
  }
  cv_.SignalAll();
  // Sent once, at once; if the coordinator is away, the exited status stays in heartbeats
  // for exited_retention_ms, so the exit still arrives.
  v1::TrainerExitRequest req;
  req.set_name(options_.name);
  req.set_agent_id(agent_id_);
  *req.mutable_trainer() = status;
  v1::TrainerExitResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, options_.rpc_timeout_ms);
  Status st = FromGrpcStatus(stub()->ReportTrainerExit(&ctx, req, &resp), "ReportTrainerExit");
  if (!st.ok()) spdlog::warn("{} (the next heartbeats carry it)", st.ToString());
}

Status Agent::Run() {
  if (options_.device == v1::CUDA && options_.gpu_health.interval_ms > 0) {
    // nvmlInit_v2 waits on the driver like any query: on a wedged one the agent registers
    // without health checks rather than never.
    using Opened = StatusOr<std::unique_ptr<GpuHealthCheck>>;
    std::optional<Opened> opened = CallWithin<Opened>(
        [gpus = options_.gpus, library = options_.nvml_library] {
          return GpuHealthCheck::Open(gpus, library);
        },
        options_.gpu_health.timeout_ms);
    Opened check = opened ? std::move(*opened)
                          : Opened(UnavailableError("NVML has not answered within " +
                                                    std::to_string(options_.gpu_health.timeout_ms) +
                                                    " ms as it started (a wedged driver or GPU)"));
    if (check.ok()) {
      spdlog::info(
          "checking the health of {} of {} GPU(s) through NVML every {} ms; {}",
          (*check)->checked(), options_.gpus.size(), options_.gpu_health.interval_ms,
          (*check)->watches_xids() ? "watching their Xid events" : "not watching Xid events");
      gpu_health_ =
          std::make_unique<GpuHealthMonitor>(std::move(*check), options_.gpu_health, clock_);
      gpu_health_->WaitForFirstRound();  // registering with its findings
    } else {
      spdlog::warn(
          "GPU health checks are off: {}; a failed GPU is found only when a trainer meets it",
          check.status().message());
    }
  }
  bool registered = false;
  bool warned = false;
  int64_t backoff_ms = 100;
  int64_t drain_until_ms = -1;  // once stopping: until when the trainers may drain
  Status result;
  while (true) {
    bool stopping = false;
    {
      MutexLock lock(&mu_);
      stopping = shutdown_;
    }
    // Stopped, the agent drains its trainers (each saves its job's checkpoint and exits) and
    // goes on heartbeating meanwhile, so that the coordinator sees them exit rather than the
    // node die, which would stop their jobs' other ranks before that checkpoint is in.
    if (stopping && drain_until_ms < 0) {
      if (!registered || supervisor_->RunningCount() == 0 || options_.shutdown_grace_ms <= 0) {
        break;
      }
      {
        MutexLock lock(&mu_);
        draining_ = true;
      }
      // The coordinator hears of it first, so that the attempt the drain ends restarts on
      // other nodes, not on this one.
      if (Status told = Heartbeat(); !told.ok()) spdlog::warn("{}", told.ToString());
      const int n = supervisor_->DrainAll(options_.shutdown_grace_ms);
      spdlog::info("shutting down: draining {} trainer(s) (a checkpoint each, within {} ms)", n,
                   options_.shutdown_grace_ms);
      drain_until_ms = clock_->NowMs() + options_.shutdown_grace_ms;
    }
    if (drain_until_ms >= 0 &&
        (supervisor_->RunningCount() == 0 || clock_->NowMs() >= drain_until_ms)) {
      break;
    }
    Status st = registered ? Heartbeat() : Register();
    if (st.ok()) {
      if (warned) spdlog::info("coordinator {} is back", options_.coordinator);
      warned = false;
      backoff_ms = 100;
      // Right after registering, heartbeat at once: its reply carries the first orders.
      int64_t wait = registered ? heartbeat_interval_ms_ : 0;
      {
        MutexLock lock(&mu_);
        if (clock_->NowMs() < fast_until_ms_) wait = std::min<int64_t>(wait, kFastHeartbeatMs);
      }
      registered = true;
      if (!watch_) {
        v1::WatchRequest req;
        req.set_name(options_.name);
        req.set_agent_id(agent_id_);
        watch_ = std::make_unique<CoordinatorWatch>(
            req, [this] { return stub(); }, [this] { Wake(); }, [this] { Wake(); },
            std::min<int64_t>(1000, heartbeat_interval_ms_));
        watch_->Start();
      }
      SleepMs(wait);  // a shutdown ends it: the loop's top drains or stops

      continue;
    }
    if (st.code() == StatusCode::kAborted) {  // asked to register again
      registered = false;
      continue;
    }
    // The coordinator refuses this node's credentials: no retry can change that, and a
    // node that lingers unregistered looks like a network fault.
    if (st.code() == StatusCode::kUnauthenticated || st.code() == StatusCode::kPermissionDenied) {
      result = st;
      break;
    }
    // After any outage register again, so a restarted coordinator learns what runs here.
    registered = false;
    if (!warned) spdlog::warn("{}; retrying with back-off (trainers keep running)", st.ToString());
    warned = true;
    SleepMs(backoff_ms);
    ResetChannel();
    // Capped at the heartbeat period too: a coordinator that restarts must hear from this
    // node before it declares it dead, and retrying at the heartbeat rate costs no more
    // than heartbeating.
    backoff_ms =
        std::min<int64_t>({backoff_ms * 2, options_.max_backoff_ms, heartbeat_interval_ms_});
  }
  if (watch_) watch_->Stop();
  spdlog::info("shutting down: stopping {} trainer(s)", supervisor_->RunningCount());
  supervisor_->StopAll(options_.shutdown_grace_ms);
  supervisor_->WaitAllExited(options_.shutdown_grace_ms + 2000);
  return result;
}

}  // namespace drover
