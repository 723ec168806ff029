// Agent: the worker node's side of the control plane.
//
// Registers the node (name, address, slots, a fresh agent_id per process start, and the
// trainers it already runs), heartbeats every interval with every trainer's status and the
// checkpoint records not yet delivered, and carries out the orders in each reply:
//   StartTrainerOrder  - fork/exec one trainer (ignored when that (job, attempt, rank) is
//                        already known; a CUDA one sees only its slot's GPU, through
//                        CUDA_VISIBLE_DEVICES), spec in <work>/jobs/<job>/attempt-<a>/job.yaml,
//                        log in <work>/logs/<job>/attempt-<a>/rank-<r>.log;
//   StopTrainersOrder  - SIGTERM the job's trainers with attempt <= the given one, SIGKILL
//                        after grace_ms (idempotent);
//   CheckpointTrainersOrder - SIGUSR1 once per request to each live trainer of the attempt:
//                        its ranks save a checkpoint at the end of the step they agree on.
// Once registered it also keeps a Watch stream open (CoordinatorWatch): its connection
// closing tells the coordinator at once that this process died, and its events (orders
// wait) and its end wake the heartbeat loop to heartbeat at once.
// Trainer exits are reported at once with ReportTrainerExit. When the coordinator is
// unreachable the trainers keep running; the agent retries with exponential back-off
// (capped at max_backoff_ms) and registers again once it answers, listing what runs.
//
// Thread-safety: Run() is called once, from the thread that should own the trainers (they
// die with it, PR_SET_PDEATHSIG). Shutdown() may be called from any thread (also from a
// signal-watching thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/tls.h"
#include "proto/drover.grpc.pb.h"
#include "worker/coordinator_watch.h"
#include "worker/gpu_health_monitor.h"
#include "worker/gpu_probe.h"
#include "worker/log_shipper.h"
#include "worker/trainer_supervisor.h"

namespace drover {

struct AgentOptions {
  std::string coordinator = "127.0.0.1:7600";
  std::string name;
  std::string address;  // shown to people; trainers bind here when set (trainer_env.h)
  int slots = 1;
  v1::DeviceKind device = v1::CPU;
  std::vector<GpuInfo> gpus;  // with device CUDA: slot i is gpus[i] (ProbeGpus)
  // With device CUDA: the GPUs' health check through NVML (gpu_health_monitor.h), its
  // findings sent with every Register and Heartbeat. interval_ms 0: never (the coordinator
  // then learns of a failed GPU only from a trainer that meets it).
  GpuHealthMonitor::Options gpu_health;
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string work_dir;
  std::string node_uid;           // node_identity.h: the same across restarts of this node's agent
  std::string trainer_path;       // the trainer executable
  int heartbeat_interval_ms = 0;  // 0: use the coordinator's value
  int rpc_timeout_ms = 2000;
  int max_backoff_ms = 2000;
  // When the agent itself stops, or an operator drains the node (drover drain): how long its
  // trainers have to drain (save their job's checkpoint and exit) before they are killed.
  int shutdown_grace_ms = 5000;
  int64_t exited_retention_ms = 60000;
  // TLS to the coordinator (common/tls.h): the files, absolute, which trainers get too
  // (trainer_env.h), and their contents. Not enabled: plaintext.
  TlsFiles tls_files;
  TlsCredentials tls;
};

class Agent {
 public:
  Agent(AgentOptions options, const Clock* clock = SystemClock::Get());
  ~Agent();

  // Runs until Shutdown(), or until the coordinator refuses this node's credentials
  // (Unauthenticated or PermissionDenied, returned). After Shutdown it drains its trainers
  // (TrainerSupervisor::DrainAll), heartbeating until they have exited or the grace period
  // is over, and returns OK; then it kills any left (also after a refusal: SIGTERM, SIGKILL
  // after the grace period).
  Status Run();
  void Shutdown();

  const std::string& agent_id() const { return agent_id_; }

 private:
  Status Register();
  // One heartbeat; on success carries out the orders.
  Status Heartbeat();
  // The GPUs' health as of their last check (GpuHealthMonitor), into `out`: the slots unfit.
  void AddGpuHealth(google::protobuf::RepeatedPtrField<v1::SlotHealth>* out);
  void StartTrainer(const v1::StartTrainerOrder& order);
  void OnTrainerExit(const v1::TrainerStatus& status);
  // Sleeps up to `ms`, returning early on Wake() or on Shutdown() (but for a drain's,
  // which wakes it only with a trainer's exit).
  void SleepMs(int64_t ms);
  // Ends the current (or next) SleepMs: heartbeat now.
  void Wake();
  // The current stub; ResetChannel replaces it after a failure, so the next call dials a
  // restarted coordinator at once instead of waiting out gRPC's reconnect back-off.
  std::shared_ptr<v1::WorkerService::Stub> stub();
  void ResetChannel();

  const AgentOptions options_;
  const Clock* clock_;
  const std::string agent_id_;

  Mutex mu_;
  CondVar cv_;
  bool shutdown_ GUARDED_BY(mu_) = false;
  // Until then (steady ms) heartbeats come every kFastHeartbeatMs: a trainer exited here, so
  // the coordinator is about to place the job's next attempt and its orders should not wait
  // a whole heartbeat period.
  int64_t fast_until_ms_ GUARDED_BY(mu_) = 0;
  bool wake_ GUARDED_BY(mu_) = false;      // ends the current SleepMs
  bool draining_ GUARDED_BY(mu_) = false;  // shut down, the trainers still draining
  std::shared_ptr<v1::WorkerService::Stub> stub_ GUARDED_BY(mu_);
  int64_t heartbeat_interval_ms_ = 1000;
  int64_t node_timeout_ms_ = 3000;  // the coordinator's, from registration
  int64_t seq_ = 0;                 // HeartbeatRequest.seq of the last Register or Heartbeat sent

  // Run()'s thread only: the NVML checks (null: none) and the findings last reported.
  std::unique_ptr<GpuHealthMonitor> gpu_health_;
  std::vector<v1::SlotHealth> unhealthy_;

  std::unique_ptr<CoordinatorWatch> watch_;  // from the first registration on
  // Declared last: destroyed first, while the stub its callbacks use is still alive.
  std::unique_ptr<LogShipper> logs_;
  std::unique_ptr<TrainerSupervisor> supervisor_;
};

// "cpu" | "cuda" -> DeviceKind; InvalidArgument otherwise.
StatusOr<v1::DeviceKind> ParseDeviceKind(const std::string& device);

}  // namespace drover
