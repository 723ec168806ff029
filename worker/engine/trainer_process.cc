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
static_assert(std::atomic<bool>::is_always_lock_free, "needed in a signal handler");

void OnStopSignal(int) {
  if (g_stop.exchange(true)) _exit(1);
}

}  // namespace

TrainerSignals InstallTrainerSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  std::thread([usr1] {
    int sig = 0;
    while (sigwait(&usr1, &sig) == 0) g_checkpoint_requests.fetch_add(1);
  }).detach();  // lives as long as the process
  return {&g_stop, &g_checkpoint_requests};
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
