#include "worker/engine/spike_detector.h"

#include <cmath>

namespace drover::engine {

SpikeDetector::SpikeDetector(const SpikeRollbackSpec& spec)
    : factor_(spec.factor), window_(static_cast<size_t>(spec.window)) {}

bool SpikeDetector::Observe(double loss) {
  if (!std::isfinite(loss)) return true;
  if (losses_.size() == window_ && loss > factor_ * mean()) return true;
  losses_.push_back(loss);
  sum_ += loss;
  if (losses_.size() > window_) {
    sum_ -= losses_.front();
    losses_.pop_front();
  }
  return false;
}

void SpikeDetector::Reset() {
  losses_.clear();
  sum_ = 0;
}

double SpikeDetector::mean() const {
  return losses_.empty() ? 0.0 : sum_ / static_cast<double>(losses_.size());
}

}  // namespace drover::engine
