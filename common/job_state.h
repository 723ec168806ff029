// What the coordinator and the CLI both need to know about a job's state.
#pragma once

#include "proto/drover.pb.h"

namespace drover {

// SUCCEEDED, FAILED or CANCELLED: the job will not run again (DESIGN.md's life cycle).
inline bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

}  // namespace drover
