// CoordinatorMetrics: what drover-coordinator exposes at /metrics, in the Prometheus text
// format rendered by prometheus-cpp (core library only; the HTTP server is ours).
//
// Two kinds of series. Counted events (RPCs, recoveries) live in a registry that lasts as
// long as this object. The cluster's state (jobs, nodes, per-job progress) is not kept
// here at all: each Render() gets a snapshot taken from the coordinator and builds those
// series afresh, so a job or node that is gone leaves no stale series behind.
//
// Series (every name starts with drover_):
//   jobs{state}                          gauge: jobs in each state
//   nodes{state}                         gauge: alive | dead | cordoned
//   slots{state}                         gauge: free | in_use | unavailable (dead/cordoned)
//   node_slots{node}, node_free_slots{node}, node_failures{node}
//   node_heartbeat_age_seconds{node}     gauge: time since the node's last heartbeat
//   rpc_requests_total{method,code}      counter: RPCs answered, by gRPC status code
//   rpc_duration_seconds{method}         histogram: receipt to answer (Heartbeat's is the
//                                        coordinator's share of heartbeat latency)
//   job_recovery_seconds                 histogram: a failed attempt's end to the next start
//   per RUNNING or RECOVERING job, labels {job_id,name}:
//   job_attempt, job_restarts, job_step, job_loss, job_tokens_per_second,
//   job_last_recovery_seconds (after a restart), job_learning_rate, job_val_loss and
//   job_hellaswag_ratio (once evaluated, the latter where the job names data.hellaswag),
//   job_mfu_ratio (where the trainer knows it), job_checkpoint_age_seconds
//   (once one is complete), job_stragglers (ranks named as stragglers: straggler.h),
//   job_time_limit_seconds and job_time_used_seconds (where resources.time_limit_minutes
//   sets one: the sum of its attempts' running times, common/job_state.h JobRanMs)
//   per rank of those jobs' current attempts, labels {job_id,name,rank}:
//   job_rank_busy_seconds (its own time a step, once it has reported one)
//
// Thread-safe: ObserveRpc from any RPC thread, Render from the HTTP server's.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "proto/drover.pb.h"

namespace drover::coordinator {

// The coordinator's state at one instant, as /metrics shows it.
struct ClusterSnapshot {
  int64_t now_ms = 0;  // wall clock
  std::map<v1::JobState, int64_t> jobs_by_state;
  std::vector<v1::WorkerInfo> workers;
  // RUNNING and RECOVERING jobs, each with its spec (the metrics read its time limit).
  std::vector<v1::JobInfo> live_jobs;
};

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // One RPC answered: `method` as "Service/Method", `code` a gRPC status code name ("OK",
  // "NOT_FOUND", ...), `seconds` from its receipt to its answer (< 0: not timed, a stream).
  void ObserveRpc(const std::string& method, const std::string& code, double seconds);

  // The exposition text: the snapshot's series, then the counted events. Recoveries found
  // in the snapshot's attempts that no earlier Render saw are counted now.
  std::string Render(const ClusterSnapshot& snapshot);

 private:
  void ObserveRecoveries(const ClusterSnapshot& snapshot) REQUIRES(mu_);

  prometheus::Registry events_;
  prometheus::Family<prometheus::Counter>& rpc_requests_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Histogram& recovery_;
  Mutex mu_;
  // Series already added, so the hot path does not rebuild bucket boundaries per call.
  std::map<std::pair<std::string, std::string>, prometheus::Counter*> rpc_counters_ GUARDED_BY(mu_);
  std::map<std::string, prometheus::Histogram*> rpc_histograms_ GUARDED_BY(mu_);
  std::set<std::pair<std::string, int64_t>> recoveries_seen_ GUARDED_BY(mu_);  // (job, attempt)
};

}  // namespace drover::coordinator
