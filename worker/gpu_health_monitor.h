// The agent's GPU health check (gpu_health.h) on a thread of its own, so that an NVML query
// that never returns cannot hold up the agent's heartbeats. NVML's queries wait on the GPU
// they ask about, and a GPU whose driver is wedged (a GSP timeout, a GPU half fallen off the
// bus) can keep one waiting for minutes: run on the heartbeat thread, it would silence the
// whole node, the coordinator would declare it dead after heartbeat_timeout and restart every
// job on it, and the agent could neither report its trainers' exits nor carry out orders.
//
// A query unanswered for `timeout_ms` is itself a finding: its GPU is reported unfit ("NVML
// has not answered ... for 15 s"), so the coordinator takes out that slot and stops the
// attempt on it, as for any other fault, while the node's other slots stay in service. The
// other GPUs keep the findings of their last finished check until the query returns (one
// thread asks about the GPUs one after another; a wedged driver rarely spares the rest).
// When it returns, the checks go on and the finding clears by itself.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "proto/drover.pb.h"
#include "worker/gpu_health.h"

namespace drover {

class GpuHealthMonitor {
 public:
  // Checks `check`'s GPUs every `interval_ms` (> 0) from a thread started here, the first
  // round at once; a query is overdue after `timeout_ms` (> 0) by `clock`, which must
  // outlive the thread (SystemClock's does).
  GpuHealthMonitor(std::unique_ptr<GpuHealthCheck> check, int interval_ms, int timeout_ms,
                   const Clock* clock = SystemClock::Get());
  // Stops the thread. One stuck in NVML is left to return (or to die with the process), with
  // what it uses: waiting for it would hang the agent's exit as it hung the query.
  ~GpuHealthMonitor();
  GpuHealthMonitor(const GpuHealthMonitor&) = delete;
  GpuHealthMonitor& operator=(const GpuHealthMonitor&) = delete;

  // Waits (real time) until the first round of checks has finished, at most timeout_ms: the
  // agent registers with its findings, so a job is never placed on a GPU already lost.
  void WaitForFirstRound();

  // The slots unfit: the last finished round's findings, and the slot whose query has gone
  // unanswered for timeout_ms, in place of its earlier one.
  std::vector<v1::SlotHealth> Unfit() const;

  // Monitors' threads in this process that have not ended, those left behind by a monitor's
  // end included.
  static int RunningThreads();

 private:
  struct State;
  static void Loop(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;  // shared with the thread, which may outlive this object
  std::thread thread_;            // after state_, which it starts with
};

// The finding for a GPU whose NVML query has gone unanswered for `waited_ms`.
std::string NvmlStallFault(const std::string& bus_id, int64_t waited_ms);

}  // namespace drover
