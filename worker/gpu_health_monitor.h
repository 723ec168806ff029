// The agent's GPU health check (gpu_health.h) on a thread of its own, so that an NVML query
// that never returns cannot hold up the agent's heartbeats. NVML's queries wait on the GPU
// they ask about, and a GPU whose driver is wedged (a GSP timeout, a GPU half fallen off the
// bus) can keep one waiting for minutes: run on the heartbeat thread, it would silence the
// whole node, the coordinator would declare it dead after heartbeat_timeout and restart every
// job on it, and the agent could neither report its trainers' exits nor carry out orders.
//
// Each GPU is checked on a thread of its own, so that a query stuck on one GPU does not stop
// the checks of the others. A query unanswered for `timeout_ms` is itself a finding: its GPU
// is reported unfit ("NVML has not answered ... within 15 s"), so the coordinator takes out
// that slot and stops the attempt on it, as for any other fault. A driver wedged for every
// GPU (NVML's calls share locks in the driver) shows on each of them; one that hangs on a
// single GPU leaves the node's other slots in service. When the query returns, the checks
// go on and the finding clears by itself.
//
// One more thread waits for the GPUs' Xid events (GpuHealthCheck::WaitForXid). A critical one
// (any Xid not in Options::ignored_xids) marks its GPU unfit from then until an operator ends
// it (drover uncordon, which reaches ClearLatches through the heartbeat reply) or the agent
// restarts: an event is not a state that clears when the GPU is mended, and NVML says nothing
// more once it is read. An Xid NVML gives no GPU for marks every GPU watched.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "proto/drover.pb.h"
#include "worker/gpu_health.h"

namespace drover {

class GpuHealthMonitor {
 public:
  // The agent's flags --gpu-health-interval-ms, --gpu-health-timeout-ms, --gpu-ignored-xids.
  struct Options {
    int interval_ms = 5000;  // how often each GPU is checked; the agent checks none for 0
    int timeout_ms = 15000;  // a query unanswered this long is a finding
    std::vector<int> ignored_xids = {std::begin(kApplicationXids), std::end(kApplicationXids)};
  };

  // Checks each of `check`'s GPUs every options.interval_ms (> 0) from a thread of its own
  // started here, the first time at once, and waits for their Xid events on another; a query
  // is overdue after options.timeout_ms (> 0) by `clock`, which must outlive the threads
  // (SystemClock's does).
  GpuHealthMonitor(std::unique_ptr<GpuHealthCheck> check, Options options,
                   const Clock* clock = SystemClock::Get());
  // Stops the threads. One stuck in NVML is left to return (or to die with the process), with
  // what it uses: waiting for it would hang the agent's exit as it hung the query.
  ~GpuHealthMonitor();
  GpuHealthMonitor(const GpuHealthMonitor&) = delete;
  GpuHealthMonitor& operator=(const GpuHealthMonitor&) = delete;

  // Waits (real time) until every GPU's first check has finished, at most timeout_ms: the
  // agent registers with their findings, so a job is never placed on a GPU already lost.
  void WaitForFirstRound();

  // The slots unfit, by slot: a GPU that had a critical Xid, that; else one whose query has
  // gone unanswered for timeout_ms, that; else its last check's finding.
  std::vector<v1::SlotHealth> Unfit() const;

  // Ends the Xid findings whose SlotHealth.latch (as Unfit gives it) is one of `latches`: an
  // operator has mended their GPUs. Other ids are no finding of this monitor's (one ended
  // already, or an earlier agent process's) and change nothing. A later Xid marks the GPU
  // again, with a new latch.
  void ClearLatches(std::span<const int64_t> latches);

  // Each GPU's reading as of its last check (GpuHealthCheck::Telemetry), by slot; none for a
  // GPU whose query has gone unanswered for timeout_ms (what it read last is stale).
  std::vector<v1::GpuTelemetry> Telemetry() const;

  // Monitors' threads in this process that have not ended, those left behind by a monitor's
  // end included.
  static int RunningThreads();

 private:
  struct State;
  static void Loop(std::shared_ptr<State> state, int gpu);
  static void WatchXids(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;      // shared with the threads, which may outlive this object
  std::vector<std::thread> threads_;  // one per GPU checked, by index in state_->gpus, then the
                                      // Xid events' where some GPU is watched for them
};

// The finding for a GPU whose NVML query has gone unanswered for `waited_ms`.
std::string NvmlStallFault(const std::string& bus_id, int64_t waited_ms);

}  // namespace drover
