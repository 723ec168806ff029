// Process-level helpers shared by the two programs that run a Trainer: `drover train` and
// drover-trainer (the agent's child).
#pragma once

#include <atomic>
#include <cstdint>

#include "common/status.h"

namespace drover::engine {

// What the signals a trainer process takes have asked for so far (TrainerOptions::stop and
// ::checkpoint_requests).
struct TrainerSignals {
  const std::atomic<bool>* stop;
  const std::atomic<uint64_t>* checkpoint_requests;
  const std::atomic<bool>* drain;
};

// Installs the handlers. Call once, from main, before any other thread starts.
//  - SIGTERM, SIGINT: set `stop` (the Trainer checks it between micro-batches). A second
//    signal of either kind exits at once with status 1, so a stuck process can still be
//    interrupted.
//  - SIGUSR1: counts a checkpoint request (the ranks agree on the step to save it at; see
//    TrainerOptions::checkpoint_requests). What Slurm's `--signal=USR1@SECONDS` sends before
//    a time limit, and what the worker agent sends for a CheckpointTrainersOrder. Training
//    goes on, so no training thread may see it: it stays blocked in every thread (the
//    mask is inherited, hence "before any other thread") and one thread of its own takes it
//    with sigwait. A system call interrupted by a handler would fail with EINTR inside Gloo,
//    NCCL or gRPC. (The agent starts trainers with it blocked already, worker/process.cc,
//    so that one sent during start-up waits instead of killing the process: SIGUSR1's
//    default action.)
//  - SIGUSR2: drain (TrainerOptions::drain): a checkpoint request as SIGUSR1's, after which
//    the trainer stops once that checkpoint is committed. What the worker agent sends its
//    trainers when it is stopped itself (the node's maintenance, a Kubernetes eviction), so
//    that what the job trained is saved within the agent's --stop-grace-ms. Taken on the
//    same thread as SIGUSR1.
TrainerSignals InstallTrainerSignalHandlers();

// The process exit code for a training outcome: 0 ok; 2 for input the user must fix
// (InvalidArgument, NotFound, FailedPrecondition, OutOfRange); 1 for everything else,
// including Cancelled (stopped before finishing).
int ExitCodeFor(const Status& status);

}  // namespace drover::engine
