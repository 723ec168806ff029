// The trainer tests' fixture: a tiny model on a tiny generated shard, run as one rank or
// as two ranks in threads.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/job_spec.h"
#include "common/token_shard.h"
#include "worker/engine/parallel/kv_store.h"
#include "worker/engine/threads.h"
#include "worker/engine/trainer.h"

namespace drover::engine {

// A learnable token stream: a repeating phrase with a little noise.
inline std::vector<uint16_t> MakeTokens(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<uint16_t> phrase = {1, 5, 9, 2, 7, 7, 3, 11, 4, 8, 6, 10, 12};
  std::vector<uint16_t> tokens(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = rng() % 10 == 0 ? static_cast<uint16_t>(rng() % 16) : phrase[i % phrase.size()];
  }
  return tokens;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetNumThreads(1);
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("trainer_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), MakeTokens(4000, 1)).ok());
    ASSERT_TRUE(WriteTokenShard((dir_ / "val.bin").string(), MakeTokens(1000, 2)).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  JobSpec Spec(const std::vector<std::string>& overrides = {}) {
    const std::string yaml =
        "name: tiny\n"
        "output_dir: " +
        (dir_ / "out").string() + "\n" +
        "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, "
        "vocab_size: 16}\n"
        "data: {train: " +
        (dir_ / "train.bin").string() + ", val: " + (dir_ / "val.bin").string() + "}\n" +
        "train: {steps: 20, global_batch: 4, micro_batch: 4, seq_len: 16, "
        "lr: 0.01, min_lr: 0.001, warmup_steps: 2, eval_every: 10, "
        "eval_batches: 2, seed: 7}\n"
        "checkpoint: {every_steps: 0}\n";
    auto spec = ParseJobSpec(yaml, overrides);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  std::unique_ptr<Trainer> Make(const JobSpec& spec, int world_size = 1) {
    TrainerOptions options;
    options.spec = spec;
    options.world_size = world_size;
    options.log_steps = false;
    auto trainer = Trainer::Create(options);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    return trainer.ok() ? std::move(trainer).value() : nullptr;
  }

  // Runs `spec` to the end as ranks 0 and 1 of a world of two, in threads, each with the
  // options `configure` adds; their results by rank.
  static std::vector<Status> RunTwoRanks(const JobSpec& spec,
                                         const std::function<void(TrainerOptions&)>& configure) {
    parallel::InMemoryKvStore store;
    std::vector<Status> results(2);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        TrainerOptions options;
        options.spec = spec;
        options.rank = rank;
        options.world_size = 2;
        options.store = &store;
        options.log_steps = false;
        options.connect_timeout = std::chrono::seconds(30);
        configure(options);
        auto trainer = Trainer::Create(options);
        results[rank] = trainer.ok() ? (*trainer)->Run() : trainer.status();
      });
    }
    for (auto& t : ranks) t.join();
    return results;
  }

  std::filesystem::path dir_;
};

inline std::vector<std::string> ReadLines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace drover::engine
