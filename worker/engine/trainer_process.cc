#include "worker/engine/trainer_process.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <thread>

#include "common/exit_codes.h"

namespace drover::engine {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<uint64_t> g_checkpoint_requests{0};
std::atomic<bool> g_drain{false};
static_assert(std::atomic<bool>::is_always_lock_free, "needed in a signal handler");

void OnStopSignal(int) {
  if (g_stop.exchange(true)) _exit(1);
}

// The request first: a training thread that sees the drain finds its request counted.
void CountRequest(int sig) {
  g_checkpoint_requests.fetch_add(1);
  if (sig == SIGUSR2) g_drain = true;
}
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counted in a signal handler");

}  // namespace

TrainerSignals InstallTrainerSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // A thread some library started before this (OpenBLAS starts its pool as it loads) has
  // them unblocked, and one sent to the process may land there: the handler counts it,
  // where their default action would kill the process. (Under the agent they are blocked
  // from exec on, worker/process.cc, so this is for `drover train` and by-hand runs.)
  struct sigaction counted = {};
  counted.sa_handler = CountRequest;
  counted.sa_flags = SA_RESTART;
  sigemptyset(&counted.sa_mask);
  sigaction(SIGUSR1, &counted, nullptr);
  sigaction(SIGUSR2, &counted, nullptr);
  sigset_t usr;
  sigemptyset(&usr);
  sigaddset(&usr, SIGUSR1);
  sigaddset(&usr, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &usr, nullptr);
  std::thread([usr] {
    int sig = 0;
    while (sigwait(&usr, &sig) == 0) CountRequest(sig);
  }).detach();  // lives as long as the process
  return {&g_stop, &g_checkpoint_requests, &g_drain};
}

int ExitCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

}  // namespace drover::engine
