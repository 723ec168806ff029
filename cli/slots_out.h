// What `drover workers` prints beside its table of nodes: a line for each slot out of use on
// a node that works on (cordoned, with how long and why, or reported unfit by its agent's
// health check; a slot cordoned for the finding that still holds is one line, not two), a
// line for each GPU its hardware slows down, and with --gpus a table of what NVML reads of
// each GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/drover.pb.h"

namespace drover::cli {

// The FAILURES cell of node `n`'s row at `now_ms`: "0", or "2 (last 5m12s ago)". The age
// says how close the count is to being forgotten (the coordinator's --node-failure-memory).
std::string FailuresCell(const v1::NodeRecord& n, int64_t now_ms);

// Node `n`'s line for an operator's cordon at `now_ms`: "NODE: drained by root@host: new
// NIC, 5m12s ago (until drover uncordon NODE)", or "" when it has none; a drain given a
// grace says so after the reason: "new NIC (trainers given 10m00s to leave), 5m12s ago".
std::string OperatorCordonLine(const v1::NodeRecord& n, int64_t now_ms);

// Node `n`'s lines at `now_ms` (the coordinator's clock) for its slots out of use, each
// "NODE slot S ...": an operator's cordon first, then failures' cordons and health findings.
std::vector<std::string> SlotsOutLines(const v1::NodeRecord& n, int64_t now_ms);

// Node `w`'s GPUs whose clocks the hardware or driver holds down, each "NODE slot S: its GPU
// is slowed down (REASONS, at T C) ...": a slow GPU holds back every rank of its job.
std::vector<std::string> SlowedGpuLines(const v1::WorkerInfo& w);

// The --gpus table's header, and node `w`'s rows for it: NODE SLOT BUSY MEMORY TEMP POWER
// SLOWDOWN ("-" where NVML did not answer).
std::vector<std::string> GpuTableHeader();
std::vector<std::vector<std::string>> GpuRows(const v1::WorkerInfo& w);

}  // namespace drover::cli
