// Agent side of the trainer status channel: folds the trainer's TrainerReport lines
// (worker/trainer_reporter.h) into the TrainerStatus that heartbeats carry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/drover.pb.h"

namespace drover {

// Applies one JSON line to `status`. A step change sets last_progress_ms = now_wall_ms (a
// phase-only report does not, so hang detection sees through chatty-but-stuck trainers).
// A checkpoint report is appended to `checkpoints` with job_id / attempt filled in from
// `status` when the trainer left them empty. A malformed line is InvalidArgument and leaves
// `status` unchanged.
Status ApplyReportLine(const std::string& line, int64_t now_wall_ms, v1::TrainerStatus* status,
                       std::vector<v1::CheckpointRecord>* checkpoints);

// Splits `buffer` into complete lines, removing them from it; a trailing partial line stays
// for the next read.
std::vector<std::string> TakeLines(std::string* buffer);

}  // namespace drover
