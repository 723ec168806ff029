#include "worker/engine/data/sampler.h"

#include <string>

namespace drover::engine {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr int kFeistelRounds = 4;

}  // namespace

Status BatchLayout::Validate() const {
  auto positive = [](const char* field, int value) {
    return InvalidArgumentError(std::string(field) + " = " + std::to_string(value) +
                                "; must be >= 1");
  };
  if (global_batch < 1) return positive("train.global_batch", global_batch);
  if (micro_batch < 1) return positive("train.micro_batch", micro_batch);
  if (dp_size < 1) return positive("dp size", dp_size);
  if (dp_rank < 0 || dp_rank >= dp_size) {
    return InvalidArgumentError("dp rank " + std::to_string(dp_rank) + " is outside [0, " +
                                std::to_string(dp_size) + ")");
  }
  if (global_batch % (dp_size * micro_batch) != 0) {
    return InvalidArgumentError("train.global_batch = " + std::to_string(global_batch) +
                                " is not divisible by dp (" + std::to_string(dp_size) +
                                ") * train.micro_batch (" + std::to_string(micro_batch) +
                                ") = " + std::to_string(dp_size * micro_batch));
  }
  return OkStatus();
}

Sampler::Sampler(uint64_t num_windows, uint64_t seed, bool shuffle, const BatchLayout& layout)
    : num_windows_(num_windows), seed_(seed), shuffle_(shuffle), layout_(layout) {
  DROVER_CHECK(num_windows > 0);
  DROVER_CHECK_OK(layout.Validate());
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < num_windows_) ++half_bits_;
}

uint64_t Sampler::WindowOf(uint64_t global_sample) const {
  const uint64_t epoch = global_sample / num_windows_;
  uint64_t x = global_sample % num_windows_;
  if (!shuffle_) return x;
  // A balanced Feistel network is a bijection on [0, 4^half_bits_); cycle walking (apply
  // it again until the value lands below N) restricts it to a bijection on [0, N). The
  // domain is < 4N, so the expected number of walks is below 4.
  const uint64_t key = SplitMix64(seed_ ^ SplitMix64(epoch));
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  do {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask;
    for (int round = 0; round < kFeistelRounds; ++round) {
      const uint64_t round_key = key + static_cast<uint64_t>(round) * 0x632be59bd9b4e019ULL;
      const uint64_t f = SplitMix64(round_key ^ right) & mask;
      const uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half_bits_) | right;
  } while (x >= num_windows_);
  return x;
}

std::vector<uint64_t> Sampler::NextMicroBatch() {
  const uint64_t per_rank = static_cast<uint64_t>(layout_.global_batch / layout_.dp_size);
  const uint64_t first = consumed_ + static_cast<uint64_t>(layout_.dp_rank) * per_rank +
                         static_cast<uint64_t>(micro_step_) * layout_.micro_batch;
  std::vector<uint64_t> windows(layout_.micro_batch);
  for (int i = 0; i < layout_.micro_batch; ++i) windows[i] = WindowOf(first + i);
  if (++micro_step_ == layout_.accum_steps()) {
    micro_step_ = 0;
    consumed_ += static_cast<uint64_t>(layout_.global_batch);
  }
  return windows;
}

SamplerState Sampler::state() const {
  SamplerState s;
  s.epoch = consumed_ / num_windows_;
  s.offset = consumed_ % num_windows_;
  s.consumed_samples = consumed_;
  s.micro_step = micro_step_;
  return s;
}

Status Sampler::Restore(const SamplerState& state) {
  if (state.epoch != state.consumed_samples / num_windows_ ||
      state.offset != state.consumed_samples % num_windows_) {
    return InvalidArgumentError("sampler position (epoch " + std::to_string(state.epoch) +
                                ", offset " + std::to_string(state.offset) + ", consumed " +
                                std::to_string(state.consumed_samples) +
                                ") does not fit a dataset of " + std::to_string(num_windows_) +
                                " windows: was the data or seq_len changed?");
  }
  if (state.micro_step < 0 || state.micro_step >= layout_.accum_steps()) {
    return InvalidArgumentError("sampler micro_step " + std::to_string(state.micro_step) +
                                " is outside [0, " + std::to_string(layout_.accum_steps()) +
                                ") for this batch layout");
  }
  consumed_ = state.consumed_samples;
  micro_step_ = state.micro_step;
  return OkStatus();
}

}  // namespace drover::engine
