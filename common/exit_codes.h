// The exit codes of drover's programs, one table for all of them (DESIGN.md: 0 success,
// 1 runtime failure, 2 usage or invalid input), and the one a trainer adds.
#pragma once

namespace drover {

enum ExitCode : int {
  kExitOk = 0,
  // A runtime failure a retry could get past (a peer died, a disk filled, a bug).
  kExitFailure = 1,
  // Input the user must fix: a bad flag, spec, data file or model. Another attempt of the
  // same job would fail the same way, so the coordinator does not restart it.
  kExitUsage = 2,
  // A trainer's GPU failed, or cannot be used at all (an uncorrectable ECC or NVLink error,
  // a GPU gone from the bus, one another process holds; worker/engine/kernels/cuda/
  // cuda_check.h says which errors). The job is not at fault, the slot is: the coordinator
  // cordons that GPU and restarts the job on the others.
  kExitDeviceFault = 3,
  // The trainer was drained (its agent is stopping: the node's shutdown) and stopped after
  // the job's checkpoint of an agreed step was committed. Neither the job nor the node is
  // at fault: the coordinator restarts the job from that checkpoint elsewhere, not counted
  // against max_restarts. 75 is sysexits' EX_TEMPFAIL ("try again later"), far from the
  // small codes a crashing program (or the tests' scripted trainer) exits with.
  kExitDrained = 75,
};

}  // namespace drover
