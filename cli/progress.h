// How the CLI shows time and a job's progress. Header-only: the CLI is a program, and its
// unit tests include this directly.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/duration.h"  // FormatDurationMs

namespace drover::cli {

// " (recomputed after restart)" while a resumed attempt trains again the steps an earlier
// attempt had reached (JobRecord.furthest_step), else "". Without it the step seen going
// back after a recovery looks like lost progress, and hiding the steps looks like a hang.
inline std::string RecomputedNote(int64_t step, int64_t furthest_step) {
  return step < furthest_step ? " (recomputed after restart)" : "";
}

// "step 340/1000 (34.0%) | 12345 tok/s | MFU 48.1% | ETA 5m12s": the ETA is the steps left
// at the slowest rank's last step time (step_ms), MFU rank 0's model FLOPs utilisation (a
// fraction); parts that are unknown (0) are left out. A step below furthest_step is marked
// as recomputed (RecomputedNote).
inline std::string FormatProgress(int64_t step, int64_t steps, double step_ms, double tokens_per_s,
                                  int64_t furthest_step = 0, double mfu = 0) {
  char buf[96];
  if (steps > 0) {
    snprintf(buf, sizeof(buf), "step %lld/%lld (%.1f%%)", static_cast<long long>(step),
             static_cast<long long>(steps), 100.0 * static_cast<double>(step) / steps);
  } else {
    snprintf(buf, sizeof(buf), "step %lld", static_cast<long long>(step));
  }
  std::string s = buf + RecomputedNote(step, furthest_step);
  if (tokens_per_s > 0) {
    snprintf(buf, sizeof(buf), " | %.0f tok/s", tokens_per_s);
    s += buf;
  }
  if (mfu > 0) {
    snprintf(buf, sizeof(buf), " | MFU %.1f%%", mfu * 100);
    s += buf;
  }
  if (steps > 0 && step >= steps) {
    s += " | done";
  } else if (steps > 0 && step_ms > 0) {
    s += " | ETA " + FormatDurationMs(static_cast<int64_t>(step_ms * (steps - step)));
  }
  return s;
}

}  // namespace drover::cli
