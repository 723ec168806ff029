// Identity of one trainer process: rank `rank` of attempt `attempt` of job `job_id`.
#pragma once

#include <compare>
#include <cstdint>
#include <string>

#include "proto/drover.pb.h"

namespace drover::coordinator {

struct TrainerKey {
  std::string job_id;
  int64_t attempt = 0;
  int32_t rank = 0;

  static TrainerKey Of(const v1::TrainerStatus& t) { return {t.job_id(), t.attempt(), t.rank()}; }
  auto operator<=>(const TrainerKey&) const = default;
};

// True while the process may still be alive (anything but EXITED).
inline bool IsLive(const v1::TrainerStatus& t) { return t.state() != v1::TRAINER_EXITED; }

}  // namespace drover::coordinator
