#include "common/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <vector>

#include "common/files.h"

namespace drover {

StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view level) {
  using spdlog::level::level_enum;
  if (level == "trace") return level_enum::trace;
  if (level == "debug") return level_enum::debug;
  if (level == "info") return level_enum::info;
  if (level == "warn" || level == "warning") return level_enum::warn;
  if (level == "error") return level_enum::err;
  if (level == "critical") return level_enum::critical;
  if (level == "off") return level_enum::off;
  return InvalidArgumentError("unknown log level '" + std::string(level) +
                              "'; valid: trace, debug, info, warn, error, critical, off");
}

Status InitLogging(const std::string& program_name, std::string_view level,
                   const std::string& file) {
  StatusOr<spdlog::level::level_enum> parsed = ParseLogLevel(level);
  if (!parsed.ok()) return parsed.status();
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!file.empty()) {
    RETURN_IF_ERROR(MakeDirs(Dirname(file)));
    try {
      sinks.push_back(
          std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false));
    } catch (const spdlog::spdlog_ex& e) {
      return UnavailableError("cannot open log file " + file + ": " + e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>(program_name, sinks.begin(), sinks.end());
  // %L: one-letter level; %n: logger name, which is the program; UTC so that logs from
  // several machines interleave correctly.
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %L %n: %v", spdlog::pattern_time_type::utc);
  logger->set_level(*parsed);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
  return OkStatus();
}

}  // namespace drover
