// Durations as people write them on a command line: "90s", "30m", "12h", "7d", "500ms",
// or a bare "0". One unit per value (no "1h30m"); "0" needs none. And how drover shows one.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace drover {

// Milliseconds in `text`; INVALID_ARGUMENT naming `what`, the value and what is accepted
// for anything else (a negative number, an unknown unit, an overflow).
StatusOr<int64_t> ParseDurationMs(const std::string& text, const std::string& what);

// A duration for people: "4.2s", "5m12s", "3h07m" (a negative one as 0).
std::string FormatDurationMs(int64_t ms);

// Minutes as a spec gives them (resources.time_limit_minutes, a float) in whole milliseconds.
int64_t MinutesToMs(double minutes);

// A time limit in minutes (resources.time_limit_minutes) for people: "12h00m", or "none"
// for 0.
std::string FormatTimeLimit(double minutes);

}  // namespace drover
