// Spawning supervised child processes (fork + exec, never threads): the mechanics the
// trainer supervisor builds on.
//
// A child gets its own process group (so a stop signals the trainer and anything it
// started), dies with the thread that spawned it (PR_SET_PDEATHSIG: a dead agent's
// trainers must not live on), has stdout+stderr appended to a log file (or written to
// descriptors the caller gives, e.g. pipes) and stdin from /dev/null, and optionally gets
// one end of a socketpair as its status channel. Every signal has its default disposition
// in the child, and only SIGUSR1 is blocked (a trainer's checkpoint request: see
// worker/engine/trainer_process.h; to other programs it stays pending, harmlessly).
//
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, so call SpawnProcess from a
// thread that lives as long as the supervisor (the agent's main loop does).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace drover {

struct SpawnOptions {
  std::string executable;         // absolute or relative path; not searched in $PATH
  std::vector<std::string> args;  // argv[1..]
  // Added to (or replacing in) the parent's environment.
  std::vector<std::pair<std::string, std::string>> env;
  std::string log_path;  // stdout+stderr, appended; created with its directory
  // Instead of log_path, when both are >= 0: the child's stdout and stderr (the caller
  // keeps these descriptors and closes its copies after the spawn).
  int stdout_fd = -1;
  int stderr_fd = -1;
  // When set, the child gets a status socket whose fd number is exported in this variable.
  std::string status_fd_env;
};

struct SpawnedProcess {
  pid_t pid = -1;      // also the process group id
  int status_fd = -1;  // parent end of the status channel (owned by the caller), or -1
};

// Forks and execs. An exec failure is not an error here: the child writes the reason to its
// log and exits 127, which the caller sees like any other exit.
StatusOr<SpawnedProcess> SpawnProcess(const SpawnOptions& options);

// `name` in the directory of the running executable (/proc/self/exe): how the programs
// find their siblings (drover-trainer next to drover-worker and drover). `name` alone when
// /proc/self/exe cannot be read.
std::string SiblingExecutable(const std::string& name);

// Exit description for people: "exit code 3", "signal 9 (Killed)".
std::string DescribeWaitStatus(int exit_code, int signal);

}  // namespace drover
