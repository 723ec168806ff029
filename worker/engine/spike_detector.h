// Loss-spike detection (fault_tolerance.spike_rollback): the decider of the trainer's
// rollback, pure, so that it is tested without training.
//
// A loss that is not finite is a spike at once. A finite loss is a spike when the window of
// the last `window` accepted losses is full and the loss exceeds `factor` times their mean.
// A spike does not enter the window; after a rollback the caller Resets it, so the
// resumed run first rebuilds its own baseline.
//
// Thread-compatible.
#pragma once

#include <deque>

#include "common/job_spec.h"

namespace drover::engine {

class SpikeDetector {
 public:
  explicit SpikeDetector(const SpikeRollbackSpec& spec);

  // True when `loss` is a spike.
  bool Observe(double loss);
  // Forgets every loss seen.
  void Reset();
  // Mean of the window (0 when empty).
  double mean() const;

 private:
  const double factor_;
  const size_t window_;
  std::deque<double> losses_;
  double sum_ = 0;
};

}  // namespace drover::engine
