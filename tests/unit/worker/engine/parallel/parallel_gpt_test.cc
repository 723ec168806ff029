// Every parallel mode against single-process training (DESIGN.md: "for the same seed, data
// and global batch, the loss of every step equals single-process training within
// floating-point tolerance"). The ranks of a job run as threads of this process, each with
// its own Trainer (so the whole path runs: mesh, process groups over Gloo on loopback,
// per-dp-rank data, ParallelGpt), connected through one in-memory bootstrap store. The
// same modes run as processes through `drover train --nproc` in tests/integration/.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/job_spec.h"
#include "common/token_shard.h"
#include "worker/engine/parallel/kv_store.h"
#include "worker/engine/threads.h"
#include "worker/engine/trainer.h"

namespace drover::engine::parallel {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 5;

struct RankResult {
  Status status;
  std::vector<double> losses;
  std::vector<double> norms;
  std::vector<float> params;  // global, on rank 0
  double val_loss = 0;
};

// What one run of RunWorld does.
struct Phase {
  int steps = kSteps;
  bool resume = false;      // from the newest checkpoint in checkpoint.dir
  bool checkpoint = false;  // write one (synchronously) after the steps
};

class ParallelEquivalenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // ctest runs every test in its own process, several at once: one directory each.
    dir_ = new fs::path(fs::path(::testing::TempDir()) /
                        ("parallel_gpt_test_" + std::to_string(::getpid())));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    std::mt19937_64 rng(11);
    std::vector<uint16_t> tokens(20000);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = rng() % 6 == 0 ? rng() % 64 : static_cast<uint16_t>((i * 5 + i / 7) % 61);
    }
    ASSERT_TRUE(WriteTokenShard((*dir_ / "train.bin").string(), tokens).ok());
    tokens.resize(3000);
    ASSERT_TRUE(WriteTokenShard((*dir_ / "val.bin").string(), tokens).ok());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  // A 4-layer model, global batch 8; `overrides` choose the mode.
  static JobSpec Spec(const std::vector<std::string>& overrides) {
    const std::string yaml =
        "name: equiv\n"
        "output_dir: " +
        (*dir_ / "out").string() +
        "\n"
        "model: {n_layer: 4, n_head: 4, n_embd: 32, block_size: 16, vocab_size: 64}\n"
        "data: {train: " +
        (*dir_ / "train.bin").string() + ", val: " + (*dir_ / "val.bin").string() +
        "}\n"
        "train: {steps: 5, global_batch: 8, micro_batch: 4, seq_len: 16, lr: 0.01, "
        "min_lr: 0.001, warmup_steps: 2, eval_every: 100, eval_batches: 4, seed: 3, "
        "grad_clip: 0.5}\n"
        "parallel: {bucket_mb: 0.02, timeout_s: 20}\n"
        "resources: {world_size: {min: 1, max: 8}}\n"
        "checkpoint: {every_steps: 0}\n";
    auto spec = ParseJobSpec(yaml, overrides);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  // Runs `phase.steps` steps of `spec` on `world` ranks (threads), evaluates, then gathers
  // the parameters.
  static std::vector<RankResult> RunWorld(const JobSpec& spec, int world, Phase phase = {}) {
    InMemoryKvStore store;
    std::vector<RankResult> results(world);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        SetNumThreads(1);
        RankResult& r = results[rank];
        TrainerOptions options;
        options.spec = spec;
        options.rank = rank;
        options.world_size = world;
        options.store = &store;
        options.log_steps = false;
        options.resume = phase.resume;
        // A rank that fails at start-up must not leave the others waiting for minutes.
        options.connect_timeout = std::chrono::seconds(30);
        auto trainer = Trainer::Create(options);
        if (!trainer.ok()) {
          r.status = trainer.status();
          return;
        }
        for (int s = 0; s < phase.steps; ++s) {
          auto m = (*trainer)->Step();
          if (!m.ok()) {
            r.status = m.status();
            return;
          }
          r.losses.push_back(m->loss);
          r.norms.push_back(m->grad_norm);
        }
        if (phase.checkpoint) {
          Status st = (*trainer)->SaveCheckpoint(/*async=*/false);
          if (!st.ok()) {
            r.status = st;
            return;
          }
        }
        auto val = (*trainer)->Evaluate();
        if (!val.ok()) {
          r.status = val.status();
          return;
        }
        r.val_loss = *val;
        auto params = (*trainer)->GlobalParams();
        if (!params.ok()) {
          r.status = params.status();
          return;
        }
        r.params = std::move(params).value();
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  // The single-process run with the same global batch and micro-batch size.
  static const RankResult& Reference(int micro_batch) {
    static auto* cache = new std::map<int, RankResult>();
    auto it = cache->find(micro_batch);
    if (it == cache->end()) {
      JobSpec spec = Spec({"train.micro_batch=" + std::to_string(micro_batch)});
      it = cache->emplace(micro_batch, RunWorld(spec, 1)[0]).first;
    }
    return it->second;
  }

  // Runs the mode and checks every rank against the single-process run.
  static void ExpectMatchesOneProcess(int world, const std::vector<std::string>& overrides) {
    JobSpec spec = Spec(overrides);
    const RankResult& want = Reference(spec.train.micro_batch);
    ASSERT_TRUE(want.status.ok()) << want.status;
    const std::vector<RankResult> got = RunWorld(spec, world);
    for (int rank = 0; rank < world; ++rank) {
      const RankResult& r = got[rank];
      ASSERT_TRUE(r.status.ok()) << "rank " << rank << ": " << r.status;
      ASSERT_EQ(r.losses.size(), want.losses.size());
      for (size_t s = 0; s < r.losses.size(); ++s) {
        EXPECT_NEAR(r.losses[s], want.losses[s], 1e-5 * std::fabs(want.losses[s]))
            << "rank " << rank << " step " << s + 1;
        EXPECT_NEAR(r.norms[s], want.norms[s], 1e-4 * want.norms[s])
            << "rank " << rank << " step " << s + 1;
      }
      EXPECT_NEAR(r.val_loss, want.val_loss, 1e-5 * want.val_loss) << "rank " << rank;
    }
    ASSERT_EQ(got[0].params.size(), want.params.size());
    double worst = 0;
    size_t worst_i = 0;
    for (size_t i = 0; i < want.params.size(); ++i) {
      const double d = std::fabs(got[0].params[i] - want.params[i]);
      if (d > worst) {
        worst = d;
        worst_i = i;
      }
    }
    EXPECT_LT(worst, 1e-5) << "largest parameter difference at global element " << worst_i;
    for (int rank = 1; rank < world; ++rank) EXPECT_TRUE(got[rank].params.empty());
  }

  static fs::path* dir_;
};

fs::path* ParallelEquivalenceTest::dir_ = nullptr;

TEST_F(ParallelEquivalenceTest, DataParallel) { ExpectMatchesOneProcess(2, {}); }

TEST_F(ParallelEquivalenceTest, DataParallelWithAccumulation) {
  ExpectMatchesOneProcess(2, {"train.micro_batch=2"});
}

TEST_F(ParallelEquivalenceTest, ZeroStage1) {
  ExpectMatchesOneProcess(2, {"train.micro_batch=2", "parallel.zero_stage=1"});
}

TEST_F(ParallelEquivalenceTest, ZeroStage2) {
  ExpectMatchesOneProcess(2, {"train.micro_batch=2", "parallel.zero_stage=2"});
}

TEST_F(ParallelEquivalenceTest, ZeroStage3) {
  ExpectMatchesOneProcess(2, {"train.micro_batch=2", "parallel.zero_stage=3"});
}

TEST_F(ParallelEquivalenceTest, PipelineGPipe) {
  ExpectMatchesOneProcess(2,
                          {"train.micro_batch=2", "parallel.pp=2", "parallel.pp_schedule=gpipe"});
}

TEST_F(ParallelEquivalenceTest, Pipeline1F1B) {
  ExpectMatchesOneProcess(2, {"train.micro_batch=2", "parallel.pp=2", "parallel.pp_schedule=1f1b"});
}

TEST_F(ParallelEquivalenceTest, FourStagePipeline) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=1", "parallel.pp=4"});
}

TEST_F(ParallelEquivalenceTest, TensorParallel) { ExpectMatchesOneProcess(2, {"parallel.tp=2"}); }

TEST_F(ParallelEquivalenceTest, DataAndPipelineParallelWithZero1) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.pp=2", "parallel.zero_stage=1"});
}

TEST_F(ParallelEquivalenceTest, DataAndTensorParallelWithZero1) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.tp=2", "parallel.zero_stage=1"});
}

TEST_F(ParallelEquivalenceTest, PipelineAndTensorParallel) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2"});
}

TEST_F(ParallelEquivalenceTest, DataPipelineAndTensorParallelWithZero1) {
  ExpectMatchesOneProcess(
      8, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2", "parallel.zero_stage=1"});
}

// Checkpoints are sharded (every rank writes the ranges of the global arenas it owns) and
// universal: one written by any mesh after 3 steps resumes at any other (and in one
// process), and the next steps are the uninterrupted run's.
TEST_F(ParallelEquivalenceTest, CheckpointOfOneMeshResumesOnAnyOther) {
  const RankResult& want = Reference(2);
  ASSERT_TRUE(want.status.ok()) << want.status;
  struct Mesh {
    int world;
    std::vector<std::string> sets;
  };
  const Mesh one{1, {}}, dp2{2, {}}, pp2{2, {"parallel.pp=2"}}, tp2{2, {"parallel.tp=2"}},
      zero3{2, {"parallel.zero_stage=3"}};
  const std::vector<std::pair<Mesh, std::vector<Mesh>>> cases = {
      {{4, {"parallel.zero_stage=2"}}, {one, dp2, pp2, tp2}},
      {{4, {"parallel.pp=2", "parallel.tp=2"}},
       {one, zero3, {4, {"parallel.pp=2", "parallel.tp=2", "parallel.zero_stage=1"}}}},
      {{4, {"parallel.tp=2", "parallel.zero_stage=3"}}, {one, pp2}},
      {{4, {"parallel.pp=4"}}, {tp2}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& [save, loads] = cases[i];
    const std::string ckpt = "checkpoint.dir=" + (*dir_ / ("ckpt" + std::to_string(i))).string();
    std::vector<std::string> sets = save.sets;
    sets.insert(sets.end(), {"train.micro_batch=2", ckpt});
    const auto saved = RunWorld(Spec(sets), save.world, {3, false, true});
    ASSERT_TRUE(saved[0].status.ok()) << saved[0].status;
    // Every rank wrote its own shard files.
    for (int r = 0; r < save.world; ++r) {
      EXPECT_TRUE(fs::exists(*dir_ / ("ckpt" + std::to_string(i)) / "step_3" /
                             ("params.r" + std::to_string(r) + ".bin")))
          << "case " << i << " rank " << r;
    }
    for (const Mesh& load : loads) {
      std::vector<std::string> lsets = load.sets;
      lsets.insert(lsets.end(), {"train.micro_batch=2", ckpt});
      const auto got = RunWorld(Spec(lsets), load.world, {2, true, false});
      SCOPED_TRACE("saved by case " + std::to_string(i) + ", resumed at world " +
                   std::to_string(load.world));
      ASSERT_TRUE(got[0].status.ok()) << got[0].status;
      ASSERT_EQ(got[0].losses.size(), 2u);
      for (int s = 0; s < 2; ++s) {
        EXPECT_NEAR(got[0].losses[s], want.losses[3 + s], 1e-5 * want.losses[3 + s]) << s;
      }
      ASSERT_EQ(got[0].params.size(), want.params.size());
      double worst = 0;
      for (size_t j = 0; j < want.params.size(); ++j) {
        worst = std::max(worst, std::fabs(double{got[0].params[j]} - want.params[j]));
      }
      EXPECT_LT(worst, 1e-5);
    }
  }
}

TEST_F(ParallelEquivalenceTest, ZeroStage3WithTensorParallel) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.tp=2", "parallel.zero_stage=3"});
}

}  // namespace
}  // namespace drover::engine::parallel
