// TrainerSupervisor: owns the trainer processes of one agent.
//
// Each trainer has a waiter thread (blocking waitpid on its pid, so the design needs no
// SIGCHLD handler and never reaps children it does not own) and a reader thread for its
// status channel. A timer thread escalates stops (SIGTERM, then SIGKILL to the process
// group after the grace period). Exited trainers stay in Snapshot() for `exited_retention_ms`
// so an exit cannot be lost between heartbeats.
//
// Thread-safety: every public method may be called from any thread. Start() forks, so call
// it from a long-lived thread (see worker/process.h on PR_SET_PDEATHSIG). The exit callback
// runs on the trainer's waiter thread with no supervisor lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "proto/drover.pb.h"
#include "worker/process.h"

namespace drover {

struct TrainerKey {
  std::string job_id;
  int64_t attempt = 0;
  int rank = 0;
  auto operator<=>(const TrainerKey&) const = default;
};

struct TrainerLaunch {
  TrainerKey key;
  SpawnOptions spawn;  // status_fd_env is filled in by the supervisor
};

class TrainerSupervisor {
 public:
  using ExitCallback = std::function<void(const v1::TrainerStatus&)>;

  // `clock` (not owned) gives wall time for started_ms / last_progress_ms and monotonic
  // time for stop deadlines and retention. `on_checkpoint`, when given, is called (from a
  // reader thread, no lock held) each time a trainer reports checkpoint records: they are
  // what a recovery resumes from, and should not wait for the next heartbeat (a node that
  // dies meanwhile would leave the coordinator resuming from an older one).
  TrainerSupervisor(const Clock* clock, ExitCallback on_exit, int64_t exited_retention_ms = 60000,
                    std::function<void()> on_checkpoint = nullptr);
  // SIGKILLs every trainer still running and joins every thread.
  ~TrainerSupervisor();

  TrainerSupervisor(const TrainerSupervisor&) = delete;
  TrainerSupervisor& operator=(const TrainerSupervisor&) = delete;

  // Starts a trainer. A key that is already known (running or recently exited) is ignored
  // and returns OK, so a repeated StartTrainerOrder is harmless. A fork failure is
  // recorded as an exit (code 127) and reported through the callback like a crash.
  Status Start(const TrainerLaunch& launch);

  bool Has(const TrainerKey& key) const;

  // Stops the trainers of `job_id` with attempt <= `max_attempt`: SIGTERM to each process
  // group now, SIGKILL after `grace_ms`. Idempotent; a repeated stop never extends the
  // deadline.
  void Stop(const std::string& job_id, int64_t max_attempt, int grace_ms);
  void StopAll(int grace_ms);
  // The node is shutting down: SIGUSR2 (drain: worker/engine/trainer_process.h) to each live
  // trainer, which saves the checkpoint its job's ranks agree on and exits kExitDrained once
  // it is committed; SIGKILL to the process groups of those still running after `grace_ms`.
  // Every later Start records its trainer as exited kExitDrained at once, so the job
  // restarts elsewhere. Returns how many trainers it signalled.
  int DrainAll(int grace_ms);
  // An operator drains the node (DrainTrainersOrder): as DrainAll for the live trainers not
  // yet asked to stop, but later starts go ahead (the coordinator places none on a drained
  // node, and one it ordered before the drain is drained by the next order). A repeated
  // drain signals no trainer twice. Returns how many trainers it signalled.
  int DrainRunning(int grace_ms);

  // Sends SIGUSR1 (a checkpoint request: worker/engine/trainer_process.h) to each live
  // trainer of (job_id, attempt) that has not had this request_id yet, and returns how
  // many it signalled. A repeated order signals nobody twice.
  int RequestCheckpoint(const std::string& job_id, int64_t attempt, int64_t request_id);

  // Blocks until no trainer runs or `timeout_ms` passes; true when none runs.
  bool WaitAllExited(int64_t timeout_ms);

  // Every running trainer and every exited one within the retention window.
  std::vector<v1::TrainerStatus> Snapshot();
  int RunningCount() const;

  // Checkpoint records reported by trainers and not yet acknowledged. The agent sends them
  // in every heartbeat until one succeeds, then calls AckCheckpoints with the count sent.
  std::vector<v1::CheckpointRecord> PendingCheckpoints() const;
  void AckCheckpoints(size_t count);

 private:
  struct Trainer {
    v1::TrainerStatus status;
    std::string log_path;  // its stdout+stderr: the last line explains a failed exit
    int status_fd = -1;
    bool reaped = false;  // waitpid returned: never signal the pid again (it may be reused)
    bool exited = false;  // the exit is recorded (after every status report was folded in)
    int64_t stop_deadline_ms = -1;   // monotonic; -1 when no stop was asked
    int64_t checkpoint_request = 0;  // the last CheckpointTrainersOrder.request_id sent to it
    int64_t exited_at_ms = 0;        // monotonic
    std::thread waiter;
    std::thread reader;
  };

  void WaitForExit(std::shared_ptr<Trainer> t);
  void ReadStatus(std::shared_ptr<Trainer> t);
  void TimerLoop();
  void StopLocked(Trainer* t, int grace_ms) REQUIRES(mu_);
  int Drain(int grace_ms, bool refuse_starts);
  void RecordExit(const std::shared_ptr<Trainer>& t, int exit_code, int signal);

  const Clock* clock_;
  ExitCallback on_exit_;
  const int64_t exited_retention_ms_;
  const std::function<void()> on_checkpoint_;

  mutable Mutex mu_;
  CondVar cv_;
  std::map<TrainerKey, std::shared_ptr<Trainer>> trainers_ GUARDED_BY(mu_);
  std::vector<v1::CheckpointRecord> checkpoints_ GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Trainer>> retired_ GUARDED_BY(mu_);  // to join
  bool shutting_down_ GUARDED_BY(mu_) = false;
  bool draining_ GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace drover
