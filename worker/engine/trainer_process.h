// Process-level helpers shared by the two programs that run a Trainer: `drover train` and
// drover-trainer (the agent's child).
#pragma once

#include <atomic>

#include "common/status.h"

namespace drover::engine {

// Installs SIGTERM and SIGINT handlers that set the returned flag (the Trainer checks it
// between micro-batches). A second signal of either kind exits at once with status 1, so a
// stuck process can still be interrupted. Call once, from main.
const std::atomic<bool>* InstallStopSignalHandlers();

// The process exit code for a training outcome: 0 ok; 2 for input the user must fix
// (InvalidArgument, NotFound, FailedPrecondition, OutOfRange); 1 for everything else,
// including Cancelled (stopped before finishing).
int ExitCodeFor(const Status& status);

}  // namespace drover::engine
