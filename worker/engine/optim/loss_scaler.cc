#include "worker/engine/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace drover::engine {
namespace {

// Below this many elements an OpenMP parallel region costs more than it saves.
constexpr int64_t kParallelThreshold = int64_t{1} << 15;

}  // namespace

Status LossScalerConfig::Validate() const {
  auto bad = [](const std::string& field, double value, const std::string& valid) {
    return InvalidArgumentError("loss scaler " + field + " = " + std::to_string(value) +
                                "; must be " + valid);
  };
  if (!(std::isfinite(initial_scale) && initial_scale > 0))
    return bad("initial_scale", initial_scale, "finite and > 0");
  if (!(std::isfinite(growth_factor) && growth_factor >= 1))
    return bad("growth_factor", growth_factor, "finite and >= 1");
  if (!(backoff_factor > 0 && backoff_factor <= 1))
    return bad("backoff_factor", backoff_factor, "in (0, 1]");
  if (growth_interval < 1) return bad("growth_interval", double(growth_interval), ">= 1");
  if (!(min_scale > 0 && min_scale <= initial_scale))
    return bad("min_scale", min_scale, "> 0 and <= initial_scale");
  return OkStatus();
}

bool HasNonFinite(const float* x, size_t n) {
  // Branch-free scan (vectorizes); inf - inf and NaN - NaN are NaN, finite - finite is 0.
  const auto count = static_cast<int64_t>(n);
  int bad = 0;
#pragma omp parallel for simd reduction(| : bad) schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) {
    const float d = x[i] - x[i];
    bad |= (d != d);
  }
  return bad != 0;
}

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& config) : config_(config) {
  DROVER_CHECK_OK(config.Validate());
  state_.scale = config.initial_scale;
}

bool DynamicLossScaler::Update(bool found_non_finite) {
  if (found_non_finite) {
    ++state_.skipped_steps;
    state_.good_steps = 0;
    if (config_.dynamic) {
      state_.scale = std::max(state_.scale * config_.backoff_factor, config_.min_scale);
    }
    return false;
  }
  ++state_.good_steps;
  if (config_.dynamic && state_.good_steps >= config_.growth_interval) {
    const float grown = state_.scale * config_.growth_factor;
    // Never grow into inf: an inf scale would make every later step overflow.
    if (std::isfinite(grown)) state_.scale = grown;
    state_.good_steps = 0;
  }
  return true;
}

Status DynamicLossScaler::Restore(const LossScalerState& state) {
  if (!(std::isfinite(state.scale) && state.scale > 0)) {
    return InvalidArgumentError("loss scaler state: scale " + std::to_string(state.scale) +
                                " is not finite and positive");
  }
  if (state.good_steps < 0 || state.skipped_steps < 0) {
    return InvalidArgumentError("loss scaler state: negative step counter");
  }
  state_ = state;
  return OkStatus();
}

}  // namespace drover::engine
