// Growing delays, the one implementation: a node's or a slot's cordon (NodeManager) and a job's
// restart delay (JobManager) both double from a base up to a cap.
#pragma once

#include <algorithm>
#include <cstdint>

namespace drover::coordinator {

// base_ms for step 0, doubled for each further step, never above max_ms.
inline int64_t DoublingDelayMs(int step, int64_t base_ms, int64_t max_ms) {
  int64_t ms = base_ms;
  for (int i = 0; i < step && ms < max_ms; ++i) ms *= 2;
  return std::min(ms, max_ms);
}

// How long a job waits before its next attempt, after attempts that failed in a row. The
// first restart is immediate: one node failure must cost no more than the recovery itself
// (the target is under 1.5 s from a failure to the new attempt's first step). A job that
// keeps failing waits base_ms, then twice as long each time, up to max_ms, so a trainer
// that exits at once does not restart ten times a second.
struct RestartBackoff {
  int64_t base_ms = 1000;  // the second restart in a row waits this long
  int64_t max_ms = 30'000;
  // An attempt that ran this long before it failed starts the count again: it was a new
  // failure, not the same one once more.
  int64_t reset_after_ms = 600'000;

  // The delay before the restart that follows the `failures_in_a_row`-th failure (>= 1).
  int64_t DelayMs(int failures_in_a_row) const {
    if (failures_in_a_row <= 1) return 0;
    return DoublingDelayMs(failures_in_a_row - 2, base_ms, max_ms);
  }
};

}  // namespace drover::coordinator
