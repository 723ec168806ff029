#include "worker/engine/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"

namespace drover::engine {
namespace {

// Below this many elements an OpenMP parallel region costs more than it saves.
constexpr int64_t kParallelThreshold = int64_t{1} << 15;

}  // namespace

void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                 float weight_decay, const AdamWConfig& config, int64_t t) {
  DROVER_CHECK(t >= 1);
  const float beta1 = config.beta1;
  const float beta2 = config.beta2;
  // Bias corrections in double: beta^t underflows gracefully, and 1 - beta2^t for small t
  // is where float would lose the most digits.
  const float correction1 = static_cast<float>(1.0 - std::pow(double{beta1}, double(t)));
  const float correction2 = static_cast<float>(1.0 - std::pow(double{beta2}, double(t)));
  const float eps = config.eps;
  const auto count = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static) if (count > kParallelThreshold)
  for (int64_t i = 0; i < count; ++i) {
    const float g = grads[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / correction1;
    const float v_hat = vi / correction2;
    params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * params[i]);
  }
}

AdamW::AdamW(std::vector<DecayRange> ranges, size_t n, const AdamWConfig& config, size_t begin,
             size_t end, Ops* ops)
    : config_(config),
      ops_(ops),
      begin_(begin),
      end_(end),
      m_(ops->Allocate(end - begin)),
      v_(ops->Allocate(end - begin)) {
  DROVER_CHECK(begin <= end && end <= n);
  // Mark each element of the owned range with its decay flag, then run-length encode.
  // Ranges outside the arena or overlapping are broken tables from the model.
  std::sort(ranges.begin(), ranges.end(),
            [](const DecayRange& a, const DecayRange& b) { return a.offset < b.offset; });
  size_t covered = 0;
  for (const DecayRange& r : ranges) {
    DROVER_CHECK_MSG(r.offset >= covered && r.offset + r.numel <= n,
                     "tensor table ranges overlap or leave the arena");
    covered = r.offset + r.numel;
  }
  auto add = [this](size_t lo, size_t hi, bool decay) {
    lo = std::max(lo, begin_);
    hi = std::min(hi, end_);
    if (lo >= hi) return;
    const float wd = decay ? config_.weight_decay : 0.0f;
    if (!segments_.empty() && segments_.back().weight_decay == wd &&
        segments_.back().offset + segments_.back().numel == lo - begin_) {
      segments_.back().numel += hi - lo;
    } else {
      segments_.push_back({lo - begin_, hi - lo, wd});
    }
  };
  size_t pos = 0;
  for (const DecayRange& r : ranges) {
    add(pos, r.offset, false);  // a gap no tensor covers: no decay
    add(r.offset, r.offset + r.numel, r.decay);
    pos = r.offset + r.numel;
  }
  add(pos, n, false);
}

void AdamW::Step(float* params, const float* grads, float lr) {
  ++step_count_;
  ops_->AdamWUpdateSegments(params, grads, m_.data(), v_.data(), segments_.data(), segments_.size(),
                            lr, config_, step_count_);
}

}  // namespace drover::engine
