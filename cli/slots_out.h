// The lines `drover workers` prints under its table for the slots out of use on nodes that
// work on: cordoned ones with how long and why, and those whose agent's health check reports
// their GPU unfit. A slot cordoned for the finding that still holds is one line, not two.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/drover.pb.h"

namespace drover::cli {

// Node `n`'s lines at `now_ms` (the coordinator's clock), each "NODE slot S ...".
std::vector<std::string> SlotsOutLines(const v1::NodeRecord& n, int64_t now_ms);

}  // namespace drover::cli
