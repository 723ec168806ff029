// The JSON documents the dashboard page polls (coordinator/http_server.h serves them):
// plain functions from the coordinator's snapshots, so tests need no server.
//
//   /api/cluster  ClusterJson: every node with its state, health and cordon, and each slot
//                 with the rank that holds it
//   /api/jobs     JobsJson: one summary per job, newest first
//   /api/jobs/ID  JobJson: one job's placement, attempts, checkpoints and its progress
//                 history for the charts. A restarted attempt has recovery_ms (from the
//                 previous attempt's end to its placement) and, once the history holds a
//                 step of it, training_again_ms (from that end to its first reported step).
//
// Times are wall-clock milliseconds; non-finite numbers are null (JSON has no NaN).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "coordinator/progress_history.h"
#include "proto/drover.pb.h"

namespace drover::coordinator {

// `running` lists the jobs whose current placement says which rank holds which slot.
nlohmann::json ClusterJson(const v1::ListWorkersResponse& workers,
                           const v1::ListJobsResponse& running, int64_t now_ms);

nlohmann::json JobsJson(const v1::ListJobsResponse& jobs);

// history: rank 0's progress as heartbeats brought it (in memory only, and the document
// says so: "history.memory_only").
nlohmann::json JobJson(const v1::JobInfo& info, const ProgressHistory::Series& history,
                       int64_t now_ms);

}  // namespace drover::coordinator
