#include "worker/trainer_supervisor.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "common/exit_codes.h"
#include "common/files.h"
#include "worker/status_channel.h"
#include "worker/trainer_env.h"

namespace drover {
namespace {

// The last non-empty line of a log, at most kMaxLine bytes: what a failed trainer said
// last (its error message, when it printed one). Empty when there is none.
std::string LastLogLine(const std::string& path) {
  constexpr size_t kTail = 4096, kMaxLine = 400;
  if (path.empty()) return "";
  auto tail = ReadFileTail(path, kTail);
  if (!tail.ok()) return "";
  std::string_view s = *tail;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) {
    s.remove_suffix(1);
  }
  const size_t nl = s.rfind('\n');
  std::string_view line = nl == std::string_view::npos ? s : s.substr(nl + 1);
  if (line.size() > kMaxLine) line = line.substr(line.size() - kMaxLine);
  return std::string(line);
}

}  // namespace

TrainerSupervisor::TrainerSupervisor(const Clock* clock, ExitCallback on_exit,
                                     int64_t exited_retention_ms,
                                     std::function<void()> on_checkpoint)
    : clock_(clock),
      on_exit_(std::move(on_exit)),
      exited_retention_ms_(exited_retention_ms),
      on_checkpoint_(std::move(on_checkpoint)) {
  timer_ = std::thread([this] { TimerLoop(); });
}

TrainerSupervisor::~TrainerSupervisor() {
  std::vector<std::shared_ptr<Trainer>> all;
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [key, t] : trainers_) {
      // A trainer that never started has pid 0: killpg(0) would kill the agent's own group.
      if (!t->reaped && t->status.pid() > 0) killpg(t->status.pid(), SIGKILL);
      all.push_back(t);
    }
    for (auto& t : retired_) all.push_back(t);
  }
  cv_.SignalAll();
  timer_.join();
  for (auto& t : all) {
    if (t->waiter.joinable()) t->waiter.join();
  }
}

Status TrainerSupervisor::Start(const TrainerLaunch& launch) {
  MutexLock lock(&mu_);
  if (shutting_down_) return FailedPreconditionError("supervisor is shutting down");
  if (trainers_.count(launch.key) > 0) return OkStatus();
  auto t = std::make_shared<Trainer>();
  v1::TrainerStatus& st = t->status;
  const bool refused = draining_;
  st.set_job_id(launch.key.job_id);
  st.set_attempt(launch.key.attempt);
  st.set_rank(launch.key.rank);
  st.set_state(v1::TRAINER_STARTING);
  st.set_started_ms(clock_->WallNowMs());
  // Hang detection counts from the start: a trainer that never reports is stuck too.
  st.set_last_progress_ms(st.started_ms());
  st.mutable_progress()->set_last_checkpoint_step(-1);
  t->log_path = launch.spawn.log_path;
  trainers_[launch.key] = t;
  if (refused) {
    t->reaped = true;  // no process: nothing to wait for, signal or kill (pid 0 is our group)
    lock.Unlock();
    // In the trainer's log, whose last line its exit carries to the coordinator.
    std::ofstream(t->log_path, std::ios::app)
        << "not started: the node is shutting down (its agent is draining its trainers)\n";
    RecordExit(t, kExitDrained, 0);
    return OkStatus();
  }

  SpawnOptions spawn = launch.spawn;
  spawn.status_fd_env = kEnvStatusFd;
  StatusOr<SpawnedProcess> proc = SpawnProcess(spawn);
  if (!proc.ok()) {
    t->reaped = true;  // no process (and pid 0, which StopLocked must never signal)
    lock.Unlock();
    RecordExit(t, 127, 0);
    return proc.status();
  }
  st.set_pid(proc->pid);
  t->status_fd = proc->status_fd;
  t->waiter = std::thread([this, t] { WaitForExit(t); });
  return OkStatus();
}

bool TrainerSupervisor::Has(const TrainerKey& key) const {
  MutexLock lock(&mu_);
  return trainers_.count(key) > 0;
}

void TrainerSupervisor::StopLocked(Trainer* t, int grace_ms) {
  if (t->reaped || t->stop_deadline_ms >= 0) return;
  const pid_t pgid = t->status.pid();
  t->status.set_state(v1::TRAINER_STOPPING);
  if (grace_ms <= 0) {
    killpg(pgid, SIGKILL);
    t->stop_deadline_ms = clock_->NowMs();
    return;
  }
  killpg(pgid, SIGTERM);
  t->stop_deadline_ms = clock_->NowMs() + grace_ms;
}

void TrainerSupervisor::Stop(const std::string& job_id, int64_t max_attempt, int grace_ms) {
  {
    MutexLock lock(&mu_);
    for (auto& [key, t] : trainers_) {
      if (key.job_id == job_id && key.attempt <= max_attempt) StopLocked(t.get(), grace_ms);
    }
  }
  cv_.SignalAll();
}

int TrainerSupervisor::RequestCheckpoint(const std::string& job_id, int64_t attempt,
                                         int64_t request_id) {
  MutexLock lock(&mu_);
  int signalled = 0;
  for (auto& [key, t] : trainers_) {
    if (key.job_id != job_id || key.attempt != attempt) continue;
    if (t->reaped || t->stop_deadline_ms >= 0 || t->checkpoint_request == request_id) continue;
    t->checkpoint_request = request_id;
    // The trainer alone, not its process group: SIGUSR1 means nothing to what it started.
    if (::kill(t->status.pid(), SIGUSR1) == 0) ++signalled;
  }
  return signalled;
}

int TrainerSupervisor::DrainAll(int grace_ms) { return Drain(grace_ms, /*refuse_starts=*/true); }

int TrainerSupervisor::DrainRunning(int grace_ms) {
  return Drain(grace_ms, /*refuse_starts=*/false);
}

int TrainerSupervisor::Drain(int grace_ms, bool refuse_starts) {
  int signalled = 0;
  {
    MutexLock lock(&mu_);
    draining_ = draining_ || refuse_starts;
    for (auto& [key, t] : trainers_) {
      if (t->reaped || t->stop_deadline_ms >= 0) continue;
      if (grace_ms <= 0) {
        StopLocked(t.get(), 0);
        continue;
      }
      // The trainer alone, as for SIGUSR1: what it started is not asked to drain.
      if (::kill(t->status.pid(), SIGUSR2) != 0) continue;
      t->status.set_state(v1::TRAINER_STOPPING);
      t->stop_deadline_ms = clock_->NowMs() + grace_ms;
      ++signalled;
    }
  }
  cv_.SignalAll();
  return signalled;
}

void TrainerSupervisor::StopAll(int grace_ms) {
  {
    MutexLock lock(&mu_);
    for (auto& [key, t] : trainers_) StopLocked(t.get(), grace_ms);
  }
  cv_.SignalAll();
}

bool TrainerSupervisor::WaitAllExited(int64_t timeout_ms) {
  MutexLock lock(&mu_);
  return cv_.WaitFor(&mu_, std::chrono::milliseconds(timeout_ms), [this]() REQUIRES(mu_) {
    for (auto& [key, t] : trainers_) {
      if (!t->exited) return false;
    }
    return true;
  });
}

std::vector<v1::TrainerStatus> TrainerSupervisor::Snapshot() {
  MutexLock lock(&mu_);
  std::vector<v1::TrainerStatus> out;
  out.reserve(trainers_.size());
  for (auto& [key, t] : trainers_) out.push_back(t->status);
  return out;
}

int TrainerSupervisor::RunningCount() const {
  MutexLock lock(&mu_);
  int n = 0;
  for (auto& [key, t] : trainers_) n += t->exited ? 0 : 1;
  return n;
}

std::vector<v1::CheckpointRecord> TrainerSupervisor::PendingCheckpoints() const {
  MutexLock lock(&mu_);
  return checkpoints_;
}

void TrainerSupervisor::AckCheckpoints(size_t count) {
  MutexLock lock(&mu_);
  if (count > checkpoints_.size()) count = checkpoints_.size();
  checkpoints_.erase(checkpoints_.begin(), checkpoints_.begin() + count);
}

void TrainerSupervisor::WaitForExit(std::shared_ptr<Trainer> t) {
  const pid_t pid = t->status.pid();
  if (t->status_fd >= 0) t->reader = std::thread([this, t] { ReadStatus(t); });
  // Wait without reaping first: while the leader is a zombie its pid (= the group id)
  // cannot be reused, so the group kill below cannot hit an unrelated process.
  siginfo_t info{};
  while (waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  killpg(pid, SIGKILL);  // anything the trainer left behind in its group
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  {
    MutexLock lock(&mu_);
    t->reaped = true;  // tells the reader to stop once the channel is drained
  }
  // Every report the trainer wrote is folded in before its exit is announced, so a final
  // checkpoint record is never overtaken by the exit.
  if (t->reader.joinable()) t->reader.join();
  int exit_code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 0;
  int signal = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
  RecordExit(t, exit_code, signal);
}

void TrainerSupervisor::ReadStatus(std::shared_ptr<Trainer> t) {
  std::string buffer;
  char chunk[4096];
  for (;;) {
    pollfd pfd{t->status_fd, POLLIN, 0};
    int r = poll(&pfd, 1, 100);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      // Nothing to read: stop once the process is gone (a grandchild that escaped the
      // group could otherwise hold the channel open forever).
      MutexLock lock(&mu_);
      if (t->reaped) break;
      continue;
    }
    ssize_t n = read(t->status_fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<size_t>(n));
    std::vector<std::string> lines = TakeLines(&buffer);
    bool checkpointed = false;
    {
      MutexLock lock(&mu_);
      const size_t before = checkpoints_.size();
      for (const std::string& line : lines) {
        // A malformed line is the trainer's bug, not a reason to lose the rest.
        (void)ApplyReportLine(line, clock_->WallNowMs(), &t->status, &checkpoints_);
      }
      checkpointed = checkpoints_.size() > before;
    }
    if (checkpointed && on_checkpoint_) on_checkpoint_();
  }
  close(t->status_fd);
}

void TrainerSupervisor::RecordExit(const std::shared_ptr<Trainer>& t, int exit_code, int signal) {
  // Read outside the lock: a log file on a slow disk must not stall heartbeats.
  const std::string last_line =
      exit_code != 0 || signal != 0 ? LastLogLine(t->log_path) : std::string();
  v1::TrainerStatus copy;
  {
    MutexLock lock(&mu_);
    t->exited = true;
    t->exited_at_ms = clock_->NowMs();
    t->status.set_state(v1::TRAINER_EXITED);
    t->status.set_exit_code(exit_code);
    t->status.set_signal(signal);
    t->status.set_last_error(last_line);
    copy = t->status;
  }
  cv_.SignalAll();
  if (on_exit_) on_exit_(copy);
}

void TrainerSupervisor::TimerLoop() {
  MutexLock lock(&mu_);
  while (!shutting_down_) {
    cv_.WaitFor(&mu_, std::chrono::milliseconds(20));
    const int64_t now = clock_->NowMs();
    std::vector<std::shared_ptr<Trainer>> to_join;
    for (auto it = trainers_.begin(); it != trainers_.end();) {
      Trainer* t = it->second.get();
      if (!t->reaped && t->stop_deadline_ms >= 0 && now >= t->stop_deadline_ms) {
        killpg(t->status.pid(), SIGKILL);
        t->stop_deadline_ms = INT64_MAX;  // escalated; do not signal again
      }
      if (t->exited && now - t->exited_at_ms >= exited_retention_ms_) {
        to_join.push_back(it->second);
        it = trainers_.erase(it);
      } else {
        ++it;
      }
    }
    if (to_join.empty()) continue;
    lock.Unlock();
    for (auto& t : to_join) {
      if (t->waiter.joinable()) t->waiter.join();
    }
    lock.Lock();
  }
}

}  // namespace drover
