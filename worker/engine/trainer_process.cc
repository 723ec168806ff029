#include "worker/engine/trainer_process.h"

#include <signal.h>
#include <unistd.h>

namespace drover::engine {
namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "needed in a signal handler");

void OnStopSignal(int) {
  if (g_stop.exchange(true)) _exit(1);
}

}  // namespace

const std::atomic<bool>* InstallStopSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  return &g_stop;
}

int ExitCodeFor(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk:
      return 0;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

}  // namespace drover::engine
