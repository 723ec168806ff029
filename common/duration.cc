#include "common/duration.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace drover {

StatusOr<int64_t> ParseDurationMs(const std::string& text, const std::string& what) {
  auto invalid = [&](const std::string& why) {
    return InvalidArgumentError(what + ": '" + text + "' " + why +
                                "; expected a number and a unit (ms, s, m, h, d), e.g. 7d, "
                                "or 0");
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) return invalid("does not start with a number");
  const std::string unit = text.substr(digits);
  int64_t per_unit;
  if (unit == "ms") {
    per_unit = 1;
  } else if (unit == "s") {
    per_unit = 1000;
  } else if (unit == "m") {
    per_unit = 60'000;
  } else if (unit == "h") {
    per_unit = 3'600'000;
  } else if (unit == "d") {
    per_unit = 86'400'000;
  } else if (unit.empty() && text.find_first_not_of('0') == std::string::npos) {
    return 0;  // "0" means the same in every unit
  } else {
    return invalid(unit.empty() ? "has no unit" : "has an unknown unit '" + unit + "'");
  }
  int64_t n = 0;
  for (size_t i = 0; i < digits; ++i) {
    const int d = text[i] - '0';
    if (n > (std::numeric_limits<int64_t>::max() - d) / 10) return invalid("is out of range");
    n = n * 10 + d;
  }
  if (n > std::numeric_limits<int64_t>::max() / per_unit) return invalid("is out of range");
  return n * per_unit;
}

std::string FormatDurationMs(int64_t ms) {
  if (ms < 0) ms = 0;
  char buf[32];
  const int64_t s = ms / 1000;
  if (s < 60) {
    snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(ms) / 1000.0);
  } else if (s < 3600) {
    snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
             static_cast<long long>(s % 60));
  } else {
    snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
             static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

int64_t MinutesToMs(double minutes) { return std::llround(minutes * 60'000.0); }

std::string FormatTimeLimit(double minutes) {
  return minutes > 0 ? FormatDurationMs(MinutesToMs(minutes)) : "none";
}

}  // namespace drover
