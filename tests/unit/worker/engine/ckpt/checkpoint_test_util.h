// Test data shared by the checkpoint tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

#include "worker/engine/ckpt/checkpoint.h"

namespace drover::engine::ckpt {

// A whole snapshot of `n` parameters for `step`, its arenas random (seeded by the step).
inline CheckpointSnapshot MakeSnapshot(int64_t step, size_t n) {
  CheckpointSnapshot s;
  s.meta.set_step(step);
  s.meta.set_num_params(static_cast<int64_t>(n));
  s.meta.set_consumed_samples(step * 12);
  s.meta.mutable_train_sampler()->set_consumed_samples(step * 12);
  s.meta.mutable_model()->set_num_layers(2);
  s.meta.set_optimizer_step(step);
  s.meta.set_world_size(1);
  s.meta.set_rng_state(0xfeedface12345678ull);
  auto* t = s.meta.add_tensors();
  t->set_name("wte");
  t->set_numel(static_cast<int64_t>(n));
  t->add_shape(static_cast<int64_t>(n));
  t->set_decay(true);
  std::mt19937 rng(static_cast<uint32_t>(step));
  std::normal_distribution<float> dist;
  for (auto* arena : {&s.params, &s.adam_m, &s.adam_v}) {
    arena->resize(n);
    for (float& x : *arena) x = dist(rng);
  }
  return s;
}

}  // namespace drover::engine::ckpt
