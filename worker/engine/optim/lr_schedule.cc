#include "worker/engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace drover::engine {

double LearningRate(const TrainSpec& train, int64_t step) {
  if (step < train.warmup_steps) {
    return train.lr * static_cast<double>(step + 1) / static_cast<double>(train.warmup_steps);
  }
  if (train.schedule == "constant") return train.lr;
  int64_t decay_start = train.warmup_steps;
  if (train.schedule == "wsd") {
    const auto decay = std::max<int64_t>(std::llround(train.decay_fraction * train.steps), 1);
    decay_start = std::max(train.steps - decay, train.warmup_steps);
    if (step < decay_start) return train.lr;
  }
  const int64_t decay_steps = train.steps - decay_start;
  // A schedule with no decay phase (warm-up covers every step) sits at the floor after it.
  double ratio = 1.0;
  if (decay_steps > 0) {
    ratio = static_cast<double>(step - decay_start) / static_cast<double>(decay_steps);
    ratio = std::clamp(ratio, 0.0, 1.0);
  }
  double coeff = 0;
  if (train.schedule == "cosine") {
    coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  } else if (train.schedule == "linear" || train.schedule == "wsd") {
    coeff = 1.0 - ratio;
  } else {
    DROVER_CHECK_MSG(false, "unknown train.schedule '" + train.schedule + "'");
  }
  return train.min_lr + coeff * (train.lr - train.min_lr);
}

Status ValidateSchedule(const std::string& schedule) {
  if (schedule == "cosine" || schedule == "linear" || schedule == "constant" || schedule == "wsd") {
    return OkStatus();
  }
  return InvalidArgumentError("train.schedule: '" + schedule +
                              "' is not a schedule; valid: cosine | linear | constant | wsd");
}

}  // namespace drover::engine
