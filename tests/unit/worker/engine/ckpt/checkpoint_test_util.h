// Test data shared by the checkpoint tests.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/ckpt/async_writer.h"
#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/parallel/kv_store.h"
#include "worker/engine/publish_fence.h"

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

inline v1::CheckpointRun MakeRun(int64_t begin, int64_t length, int64_t stride, int64_t count) {
  v1::CheckpointRun r;
  r.set_begin(begin);
  r.set_length(length);
  r.set_stride(stride);
  r.set_count(count);
  return r;
}

// The part of a whole snapshot at `runs`, as rank `rank` would hold it.
inline ShardSnapshot PartOf(const CheckpointSnapshot& whole, int rank,
                            const std::vector<v1::CheckpointRun>& runs) {
  ShardSnapshot part;
  part.meta = whole.meta;
  part.shard.rank = rank;
  part.shard.runs = runs;
  for (const auto& r : runs) {
    for (int64_t i = 0; i < r.count(); ++i) {
      const int64_t b = r.begin() + i * r.stride();
      for (auto [from, to] : {std::pair{&whole.params, &part.shard.params},
                              std::pair{&whole.adam_m, &part.shard.adam_m},
                              std::pair{&whole.adam_v, &part.shard.adam_v}}) {
        to->insert(to->end(), from->begin() + b, from->begin() + b + r.length());
      }
    }
  }
  return part;
}

// Three ranks' parts of a 120-element model: interleaved strided runs (as tensor-parallel
// column blocks lie) plus plain ranges.
inline std::vector<std::vector<v1::CheckpointRun>> ThreeRankRuns() {
  return {{MakeRun(0, 10, 30, 3), MakeRun(90, 10, 10, 1)},    // 0-9, 30-39, 60-69, 90-99
          {MakeRun(10, 10, 30, 3), MakeRun(100, 10, 10, 1)},  // 10-19, 40-49, 70-79, 100-109
          {MakeRun(20, 10, 30, 3), MakeRun(110, 10, 10, 1)}};
}

// An in-memory store whose next `away_sets` Sets and `away_gets` Gets fail Unavailable (the
// gRPC status of a coordinator that is not listening), as the rendezvous client sees a
// restart, and which loses every key at Restart(), as the coordinator's rendezvous service
// does when it restarts.
class AwayKvStore final : public parallel::KvStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    ++sets;
    if (Take(&away_sets))
      return UnavailableError("rendezvous Set '" + key + "': Connection refused");
    return store_.Set(Now(key), value);
  }
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    ++gets;
    if (Take(&away_gets)) return UnavailableError("rendezvous Wait: Connection refused");
    return store_.Get(Now(key), timeout);
  }
  // Keys set from now on live in a namespace of their own: those set before are gone.
  void Restart() { ++generation_; }

  std::atomic<int> away_sets{0}, away_gets{0};
  std::atomic<int> sets{0}, gets{0};

 private:
  static bool Take(std::atomic<int>* away) {
    int left = away->load();
    while (left > 0 && !away->compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  }
  std::string Now(const std::string& key) const {
    return std::to_string(generation_.load()) + "/" + key;
  }
  std::atomic<int> generation_{0};
  parallel::InMemoryKvStore store_;
};

// The coordinator's lease service, away (Unavailable) while `away` is set.
struct AwayFence : PublishFence {
  bool Current() const override { return !away; }
  Status Confirm() override {
    return away ? UnavailableError("coordinator: Connection refused") : OkStatus();
  }
  std::atomic<bool> away{false};
};

}  // namespace drover::engine::ckpt
