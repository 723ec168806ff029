// Durations as people write them on a command line: "90s", "30m", "12h", "7d", "500ms",
// or a bare "0". One unit per value (no "1h30m"); "0" needs none.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace drover {

// Milliseconds in `text`; INVALID_ARGUMENT naming `what`, the value and what is accepted
// for anything else (a negative number, an unknown unit, an overflow).
StatusOr<int64_t> ParseDurationMs(const std::string& text, const std::string& what);

}  // namespace drover
