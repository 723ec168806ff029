// Dynamic loss scaling for fp16 training (device-independent; exercised on CPU by tests).
//
// The loss is multiplied by scale() before backward, so gradients arrive scaled; the
// trainer unscales them (multiply by 1/scale()) and checks them for inf/NaN, then calls
// Update(found_non_finite):
//   - non-finite: skip the optimizer step, scale *= backoff_factor (not below min_scale),
//     reset the good-step counter;
//   - finite: take the step; after growth_interval consecutive good steps,
//     scale *= growth_factor and reset the counter.
// A static scaler (dynamic = false) keeps its scale but still skips non-finite steps.
//
// Not thread-safe; one per trainer process. The state is saved in checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace drover::engine {

struct LossScalerConfig {
  float initial_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;  // consecutive good steps before growing
  float min_scale = 1.0f;
  bool dynamic = true;

  // InvalidArgument naming the field unless every knob is in range.
  Status Validate() const;
};

// The part of the scaler that a checkpoint stores.
struct LossScalerState {
  float scale = 65536.0f;
  int64_t good_steps = 0;     // consecutive finite steps since the last change
  int64_t skipped_steps = 0;  // total steps skipped for non-finite gradients
};

// True if any of x[0..n) is inf or NaN.
bool HasNonFinite(const float* x, size_t n);

class DynamicLossScaler {
 public:
  // CHECKs config.Validate().
  explicit DynamicLossScaler(const LossScalerConfig& config = {});

  float scale() const { return state_.scale; }

  // Records the outcome of one step's gradients. Returns true if the optimizer step should
  // be taken, false if it must be skipped.
  bool Update(bool found_non_finite);

  const LossScalerState& state() const { return state_; }
  // InvalidArgument if the scale is not finite and positive or a counter is negative.
  Status Restore(const LossScalerState& state);

  const LossScalerConfig& config() const { return config_; }

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace drover::engine
