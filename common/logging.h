// Logging set-up for every drover program, on spdlog: the one place that decides the line
// format, so that coordinator, agent and trainer logs read alike and sort by time:
//
//   2026-11-29T23:41:07.123Z I drover-worker: registered as node-1 with 4 slots
//
// (UTC time, one-letter level, program name, message). Code logs with spdlog::info(...)
// etc. on the default logger that InitLogging installs.
#pragma once

#include <spdlog/common.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace drover {

// "trace", "debug", "info", "warn" (or "warning"), "error", "critical" or "off";
// InvalidArgument naming the valid levels otherwise.
StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view level);

// Installs the default logger: stderr, plus `file` (appended to, parent directory created)
// when not empty. Every message is flushed at once, so the lines before a crash are kept.
// Call early in main, before other threads log; calling it again replaces the logger.
Status InitLogging(const std::string& program_name, std::string_view level = "info",
                   const std::string& file = "");

}  // namespace drover
