// `drover train JOB.yaml --nproc N` with N > 1: N drover-trainer processes on this
// machine, without a coordinator.
//
// The launcher stands in for the two parts of a cluster that trainers talk to, and for
// nothing more: the coordinator's rendezvous store (a RendezvousServer on 127.0.0.1, an
// ephemeral port, attempt 1 of job "local-<pid>") and the worker agent (the environment
// of worker/trainer_env.h; supervision by TrainerSupervisor). There is no recovery: the
// first rank that fails ends the run and the others are stopped at once, since survivors
// must never sit in a collective waiting for a dead peer (DESIGN.md, "Recovery").
//
// Each rank's stdout and stderr reach the launcher's, line by line, prefixed "[rank R] ".
// SIGINT and SIGTERM to the launcher stop every rank the same way; SIGUSR1 is passed on to
// every rank, which then save a checkpoint at the end of the step they agree on. No rank
// outlives the launcher (PR_SET_PDEATHSIG, worker/process.h).
#pragma once

#include <string>

#include "common/job_spec.h"

namespace drover::cli {

struct LocalLaunchOptions {
  JobSpec spec;  // the effective spec (overrides applied), validated
  int nproc = 2;
  int threads = 0;           // DROVER_THREADS per rank; 0: spec.resources.threads_per_rank
  bool fresh = false;        // DROVER_FRESH=1: ranks ignore existing checkpoints
  std::string trainer_path;  // empty: drover-trainer next to this executable
  int stop_grace_ms = 3000;  // SIGTERM to SIGKILL when ranks are stopped
};

// Runs the ranks to the end. Returns `drover train`'s exit code: 0 when every rank exited
// 0; 2 for a layout that does not fit nproc (nothing is started), a missing trainer, or a
// rank that exited 2 first; 1 otherwise (a rank failed, or the launcher was interrupted).
// Call from the main thread before any other thread exists: it blocks SIGINT and SIGTERM
// for the threads it starts.
int RunLocalLaunch(const LocalLaunchOptions& options);

}  // namespace drover::cli
