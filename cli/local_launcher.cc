#include "cli/local_launcher.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "common/clock.h"
#include "common/files.h"
#include "common/mutex.h"
#include "coordinator/rendezvous_service.h"
#include "worker/gpu_probe.h"
#include "worker/line_forwarder.h"
#include "worker/process.h"
#include "worker/trainer_env.h"
#include "worker/trainer_supervisor.h"

namespace drover::cli {
namespace {

constexpr int64_t kAttempt = 1;
// Once the ranks are gone: how long their last output may take to leave the pipes.
constexpr int64_t kDrainMs = 1000;

// How a launch ended: the exit code of `drover train` and a line for people.
struct LaunchEnd {
  int exit_code = kExitOk;
  std::string why;
};

// Decides the end of a launch from what happens first: every rank exiting 0, a rank
// failing, a signal to the launcher, or a start failure. Later events change nothing (the
// ranks the launcher stops exit by its SIGTERM, which is not news). Thread-safe: fed by
// the supervisor's waiter threads and the signal thread.
class LaunchOutcome {
 public:
  explicit LaunchOutcome(int nproc) : nproc_(nproc), running_(nproc) {}

  void OnExit(const v1::TrainerStatus& s) {
    if (s.exit_code() == 0 && s.signal() == 0) {
      MutexLock lock(&mu_);
      if (--running_ > 0) return;
      EndLocked({kExitOk, "all " + std::to_string(nproc_) + " ranks finished"});
      return;
    }
    if (s.signal() == 0 && s.exit_code() == kExitDrained) {
      // The others drain too (SIGUSR2 went to every rank); the launcher waits for them.
      MutexLock lock(&mu_);
      EndLocked({kExitDrained,
                 "drained (SIGUSR2): the ranks saved the checkpoint of the step "
                 "they agreed on and stopped"});
      return;
    }
    // A rank's exit 2 means input the user must fix; anything else is a runtime failure.
    const int code = s.signal() == 0 && s.exit_code() == kExitUsage ? kExitUsage : kExitFailure;
    MutexLock lock(&mu_);
    EndLocked({code, "rank " + std::to_string(s.rank()) + " failed with " +
                         DescribeWaitStatus(s.exit_code(), s.signal()) +
                         "; the other ranks were stopped"});
  }

  void OnSignal(int sig) {
    MutexLock lock(&mu_);
    EndLocked({kExitFailure,
               "interrupted by " + DescribeWaitStatus(0, sig) + "; every rank was stopped"});
  }

  // SIGUSR1 to the launcher is a checkpoint request for the ranks (trainer_process.h),
  // passed on by `forward` while one is set.
  void SetCheckpointForward(std::function<void()> forward) {
    MutexLock lock(&mu_);
    forward_ = std::move(forward);
  }
  void OnCheckpointSignal() {
    MutexLock lock(&mu_);
    if (forward_) forward_();
  }
  // SIGUSR2 to the launcher drains the ranks (trainer_process.h), passed on by `drain` while
  // one is set.
  void SetDrainForward(std::function<void()> drain) {
    MutexLock lock(&mu_);
    drain_ = std::move(drain);
  }
  void OnDrainSignal() {
    MutexLock lock(&mu_);
    if (drain_) drain_();
  }

  void Fail(const std::string& why) {
    MutexLock lock(&mu_);
    EndLocked({kExitFailure, why});
  }

  LaunchEnd Wait() {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return end_.has_value(); });
    return *end_;
  }

 private:
  void EndLocked(LaunchEnd end) REQUIRES(mu_) {
    if (end_.has_value()) return;
    end_ = std::move(end);
    cv_.SignalAll();
  }

  const int nproc_;
  Mutex mu_;
  CondVar cv_;
  int running_ GUARDED_BY(mu_);
  std::optional<LaunchEnd> end_ GUARDED_BY(mu_);
  std::function<void()> forward_ GUARDED_BY(mu_);
  std::function<void()> drain_ GUARDED_BY(mu_);
};

// SIGINT and SIGTERM to the launcher end the launch; SIGUSR1 asks the ranks for a
// checkpoint, SIGUSR2 drains them (a checkpoint, then they stop). They are taken by one thread with
// sigwait (as in drover-worker), so no handler runs inside gRPC or the supervisor, and blocked
// first, before any thread starts, so every thread inherits the mask (the ranks get their own,
// worker/process.cc).
class StopSignals {
 public:
  explicit StopSignals(LaunchOutcome* outcome) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGUSR1);
    sigaddset(&set_, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
    thread_ = std::thread([this, outcome] {
      int sig = 0;
      while (sigwait(&set_, &sig) == 0 && !done_) {
        if (sig == SIGUSR1) {
          outcome->OnCheckpointSignal();
        } else if (sig == SIGUSR2) {
          outcome->OnDrainSignal();
        } else {
          outcome->OnSignal(sig);
        }
      }
    });
  }
  ~StopSignals() {
    done_ = true;
    pthread_kill(thread_.native_handle(), SIGTERM);  // taken by its sigwait, not the process
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

 private:
  sigset_t set_;
  sigset_t old_mask_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// What every rank shares.
struct RankContext {
  std::string trainer;
  std::string job_id;
  std::string rendezvous;  // host:port
  std::string spec_path;
  int nproc = 0;
  int threads = 1;
  bool fresh = false;
  // CUDA jobs: the GPUs the ranks are spread over (worker/gpu_probe.h); empty otherwise.
  std::vector<std::string> gpus;
};

// The environment contract of worker/trainer_env.h for one rank. Every variable is set,
// so none leaks in from the launcher's own environment.
std::vector<std::pair<std::string, std::string>> RankEnv(const RankContext& c, int rank) {
  std::vector<std::pair<std::string, std::string>> env = {
      {kEnvCoordinator, c.rendezvous},
      {kEnvJobId, c.job_id},
      {kEnvAttempt, std::to_string(kAttempt)},
      {kEnvRank, std::to_string(rank)},
      {kEnvWorldSize, std::to_string(c.nproc)},
      {kEnvLocalRank, std::to_string(rank)},
      {kEnvSlot, std::to_string(rank)},
      {kEnvSpecPath, c.spec_path},
      {kEnvResume, ""},
      {kEnvThreads, std::to_string(c.threads)},
      {kEnvFresh, c.fresh ? "1" : "0"},
      // The local rendezvous server speaks plaintext on loopback.
      {kEnvTlsCert, ""},
      {kEnvTlsKey, ""},
      {kEnvTlsCa, ""}};
  if (!c.gpus.empty()) {
    env.emplace_back("CUDA_VISIBLE_DEVICES", VisibleDeviceForLocalRank(rank, c.gpus));
    env.emplace_back(kEnvRanksOnGpu, std::to_string(LocalRanksOnGpuOf(
                                         rank, c.nproc, static_cast<int>(c.gpus.size()))));
  }
  return env;
}

// The GPUs a CUDA job's local ranks are spread over: this process's CUDA_VISIBLE_DEVICES
// entries when set, else the driver's ordinals; empty when neither lists any (the ranks then
// fail at start-up with the driver's reason).
std::vector<std::string> LocalGpus() {
  std::vector<std::string> gpus;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr && *visible != '\0') {
    std::stringstream list(visible);
    for (std::string entry; std::getline(list, entry, ',');) {
      if (!entry.empty()) gpus.push_back(entry);
    }
    return gpus;
  }
  StatusOr<std::vector<GpuInfo>> probed = ProbeGpus();
  if (probed.ok()) {
    for (const GpuInfo& gpu : *probed) gpus.push_back(std::to_string(gpu.index));
  }
  return gpus;
}

// Starts rank `rank` with its stdout and stderr on pipes whose read ends are appended to
// `sources`. A fork failure reaches the outcome through the supervisor's exit callback.
Status StartRank(const RankContext& c, int rank, TrainerSupervisor* supervisor,
                 std::vector<LineForwarder::Source>* sources) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  if (pipe2(err, O_CLOEXEC) != 0) {
    Status st = ErrnoToStatus(errno, "pipe");
    close(out[0]);
    close(out[1]);
    return st;
  }
  TrainerLaunch launch;
  launch.key = TrainerKey{c.job_id, kAttempt, rank};
  launch.spawn.executable = c.trainer;
  launch.spawn.env = RankEnv(c, rank);
  launch.spawn.stdout_fd = out[1];
  launch.spawn.stderr_fd = err[1];
  Status st = supervisor->Start(launch);
  // The child has its copies; the launcher's would keep the pipes from ever reaching EOF.
  close(out[1]);
  close(err[1]);
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  sources->push_back({out[0], STDOUT_FILENO, prefix});
  sources->push_back({err[0], STDERR_FILENO, prefix});
  return st;
}

// Runs the ranks of `c` under a supervisor until the outcome ends, stops the survivors
// and forwards their output to the end.
LaunchEnd RunRanks(const RankContext& c, int stop_grace_ms, LaunchOutcome* outcome) {
  TrainerSupervisor supervisor(SystemClock::Get(),
                               [outcome](const v1::TrainerStatus& s) { outcome->OnExit(s); });
  std::vector<LineForwarder::Source> sources;
  for (int rank = 0; rank < c.nproc; ++rank) {
    Status st = StartRank(c, rank, &supervisor, &sources);
    if (!st.ok()) {
      outcome->Fail("cannot start rank " + std::to_string(rank) + ": " + st.ToString());
      break;
    }
  }
  LineForwarder forwarder(std::move(sources));
  int64_t requests = 0;  // the signal thread's, under the outcome's lock
  outcome->SetCheckpointForward([&supervisor, &c, &requests] {
    const int n = supervisor.RequestCheckpoint(c.job_id, kAttempt, ++requests);
    std::fprintf(stderr, "drover train: SIGUSR1: asked %d ranks for a checkpoint\n", n);
  });
  outcome->SetDrainForward([&supervisor, stop_grace_ms] {
    const int n = supervisor.DrainAll(stop_grace_ms);
    std::fprintf(stderr, "drover train: SIGUSR2: draining %d ranks (a checkpoint, then stop)\n", n);
  });
  LaunchEnd end = outcome->Wait();
  outcome->SetCheckpointForward(nullptr);  // before the supervisor goes
  outcome->SetDrainForward(nullptr);
  if (end.exit_code != kExitOk) supervisor.StopAll(stop_grace_ms);
  // The supervisor escalates to SIGKILL at the grace, so this returns soon after it.
  supervisor.WaitAllExited(stop_grace_ms + kDrainMs);
  forwarder.Finish(kDrainMs);
  return end;
}

// Usage errors, found before anything starts.
Status CheckLaunch(const LocalLaunchOptions& o, const std::string& trainer) {
  if (Status st = o.spec.ValidateForWorldSize(o.nproc); !st.ok()) {
    return InvalidArgumentError("--nproc " + std::to_string(o.nproc) + ": " + st.message());
  }
  if (access(trainer.c_str(), X_OK) != 0) {
    return InvalidArgumentError("trainer executable '" + trainer +
                                "' is missing or not executable" +
                                (o.trainer_path.empty() ? " (build drover-trainer)" : ""));
  }
  return OkStatus();
}

StatusOr<LaunchEnd> Launch(const LocalLaunchOptions& o, const std::string& trainer) {
  LaunchOutcome outcome(o.nproc);
  StopSignals signals(&outcome);  // first: before any other thread starts
  signal(SIGPIPE, SIG_IGN);       // a closed terminal must not kill the launcher mid-run

  ASSIGN_OR_RETURN(const std::string dir, MakeTempDir("drover-train-"));
  struct RemoveAtExit {
    std::string path;
    ~RemoveAtExit() { (void)RemoveAll(path); }
  } remove_dir{dir};
  RankContext c;
  c.trainer = trainer;
  c.job_id = "local-" + std::to_string(getpid());
  c.spec_path = dir + "/job.yaml";
  c.nproc = o.nproc;
  c.threads = o.threads > 0 ? o.threads : o.spec.resources.threads_per_rank;
  c.fresh = o.fresh;
  if (o.spec.resources.device == "cuda") c.gpus = LocalGpus();
  RETURN_IF_ERROR(WriteFileAtomic(c.spec_path, JobSpecToYaml(o.spec)));

  coordinator::RendezvousStore store;
  store.OpenAttempt(c.job_id, kAttempt);
  ASSIGN_OR_RETURN(auto server, coordinator::RendezvousServer::Start(&store, "127.0.0.1"));
  c.rendezvous = server->address();
  std::fprintf(stderr, "drover train: starting %d ranks of %s (job %s, rendezvous %s)\n", o.nproc,
               trainer.c_str(), c.job_id.c_str(), c.rendezvous.c_str());
  LaunchEnd end = RunRanks(c, o.stop_grace_ms, &outcome);
  // Wakes any Wait still blocked in the store, so that the server's shutdown need not wait
  // for it to time out.
  store.CloseAttempt(c.job_id, kAttempt);
  server->Shutdown();
  return end;
}

}  // namespace

int RunLocalLaunch(const LocalLaunchOptions& options) {
  const std::string trainer =
      options.trainer_path.empty() ? SiblingExecutable("drover-trainer") : options.trainer_path;
  if (Status st = CheckLaunch(options, trainer); !st.ok()) {
    std::fprintf(stderr, "drover train: %s\n", st.message().c_str());
    return kExitUsage;
  }
  StatusOr<LaunchEnd> end = Launch(options, trainer);
  if (!end.ok()) {
    std::fprintf(stderr, "drover train: %s\n", end.status().ToString().c_str());
    return kExitFailure;
  }
  std::fprintf(stderr, "drover train: %s\n", end->why.c_str());
  return end->exit_code;
}

}  // namespace drover::cli
