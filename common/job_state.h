// What the coordinator and the CLI both need to know about a job's state.
#pragma once

#include <algorithm>
#include <cstdint>

#include "proto/drover.pb.h"

namespace drover {

// SUCCEEDED, FAILED or CANCELLED: the job will not run again (DESIGN.md's life cycle).
inline bool IsTerminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

// How long attempt `a` of `job` has run: from its start to its end, or to wall time now_ms
// while it is the RUNNING job's current attempt. resources.time_limit_minutes bounds the sum
// over a job's attempts.
inline int64_t AttemptRanMs(const v1::JobRecord& job, const v1::AttemptRecord& a, int64_t now_ms) {
  int64_t end = a.ended_ms();
  if (end <= 0) {
    if (job.state() != v1::RUNNING || a.attempt() != job.attempt()) return 0;
    end = now_ms;
  }
  return a.started_ms() > 0 ? std::max<int64_t>(0, end - a.started_ms()) : 0;
}

// The sum of AttemptRanMs over the job's attempts: what its time limit counts.
inline int64_t JobRanMs(const v1::JobInfo& info, int64_t now_ms) {
  int64_t ran_ms = 0;
  for (const v1::AttemptRecord& a : info.attempts()) ran_ms += AttemptRanMs(info.job(), a, now_ms);
  return ran_ms;
}

}  // namespace drover
