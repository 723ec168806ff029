// What `drover top` shows: one frame of text from the cluster's state, computed by a pure
// function so that tests check the frame without a terminal, a clock or a coordinator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/drover.pb.h"

namespace drover::cli {

// The state one frame shows, as the coordinator reported it.
struct TopSnapshot {
  std::string coordinator;          // its address, for the title line
  v1::ListWorkersResponse workers;  // live trainers only
  std::vector<v1::JobInfo> jobs;    // the active jobs (pending, running, recovering)
  int64_t now_ms = 0;               // wall clock the heartbeat ages are measured against
};

// The frame: a title line, the node table and the job table, each line cut to `width`
// characters (0: no limit). Ends with a newline. Never fails: a job whose spec does not
// parse shows its step without a total.
std::string RenderTop(const TopSnapshot& snapshot, int width);

}  // namespace drover::cli
