// AdamW with decoupled weight decay (Loshchilov & Hutter), as nanoGPT and llm.c apply it:
//
//   m = beta1*m + (1-beta1)*g            v = beta2*v + (1-beta2)*g^2
//   m_hat = m / (1-beta1^t)              v_hat = v / (1-beta2^t)        (t = 1 on the first step)
//   p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)
//
// Weight decay applies only to tensors marked `decay` (matrices and embeddings); biases and
// LayerNorm parameters are updated with wd = 0, as nanoGPT groups them.
//
// The optimizer state (m, v) is two fp32 arenas that mirror a contiguous range
// [begin, end) of the flat parameter arena. The whole arena is the default; ZeRO gives each
// rank its own shard range, and the free function AdamWUpdate works on any sub-range. The
// arenas come from the kernel table's allocator and the update runs through it, so the
// same optimizer drives host and device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/optim/adamw_config.h"

namespace drover::engine {

// A run of the flat arena that shares one weight-decay setting.
struct DecayRange {
  size_t offset = 0;
  size_t numel = 0;
  bool decay = false;
};

// Builds the decay table from a model tensor table (model::TensorInfo or anything with
// `offset`, `numel` and `decay` members). A template so that the optimizer does not
// depend on the model library.
template <typename TensorTable>
std::vector<DecayRange> DecayRangesOf(const TensorTable& tensors) {
  std::vector<DecayRange> ranges;
  ranges.reserve(tensors.size());
  for (const auto& t : tensors) ranges.push_back({t.offset, t.numel, t.decay});
  return ranges;
}

// One AdamW update of n contiguous elements with a single decay value. `t` is the 1-based
// step number used for bias correction. params, grads, m, v each point at n floats.
void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                 float weight_decay, const AdamWConfig& config, int64_t t);

class AdamW {
 public:
  // Optimizer for the whole arena of n parameters. `tensors` is a model tensor table (see
  // DecayRangesOf); elements no tensor covers get no weight decay.
  template <typename TensorTable>
  AdamW(const TensorTable& tensors, size_t n, const AdamWConfig& config, Ops* ops = CpuOps())
      : AdamW(DecayRangesOf(tensors), n, config, 0, n, ops) {}

  // Optimizer for the shard [begin, end) of an arena of n parameters (ZeRO). m and v have
  // end - begin elements. CHECKs begin <= end <= n.
  AdamW(std::vector<DecayRange> ranges, size_t n, const AdamWConfig& config, size_t begin,
        size_t end, Ops* ops = CpuOps());

  // One step over the owned range: increments step_count() first, then updates with
  // t = step_count(). `params` and `grads` point at element `begin()` of their arenas (for
  // the unsharded optimizer, the arena itself). Not thread-safe; OpenMP inside.
  void Step(float* params, const float* grads, float lr);

  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  size_t size() const { return end_ - begin_; }
  const AdamWConfig& config() const { return config_; }

  // Number of steps taken (0 before the first). Checkpoints save and restore it with m, v.
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t steps) { step_count_ = steps; }

  // The moment arenas, size() floats each, indexed from begin(), in the ops' memory.
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }

 private:
  AdamWConfig config_;
  Ops* ops_;
  size_t begin_;
  size_t end_;
  // [begin_, end_) in runs of one weight decay, relative to begin_.
  std::vector<AdamWSegment> segments_;
  Buffer m_;
  Buffer v_;
  int64_t step_count_ = 0;
};

}  // namespace drover::engine
