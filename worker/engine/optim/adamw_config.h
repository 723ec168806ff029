// AdamW's hyper-parameters, apart from the learning rate (which the schedule gives per step).
// Its own header so that the kernel table (kernels/ops.h) can name it without the optimizer.
#pragma once

#include <cstddef>

namespace drover::engine {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// A run of the optimizer's arenas that shares one weight-decay value (Ops::AdamWUpdateSegments):
// elements [offset, offset + numel) from the arenas' starts.
struct AdamWSegment {
  size_t offset = 0;
  size_t numel = 0;
  float weight_decay = 0.0f;
};

}  // namespace drover::engine
