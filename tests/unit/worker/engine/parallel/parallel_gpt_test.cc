// Every parallel mode against single-process training (DESIGN.md: "for the same seed, data
// and global batch, the loss of every step equals single-process training within
// floating-point tolerance"). The ranks of a job run as threads of this process, each with
// its own Trainer (so the whole path runs: mesh, process groups over Gloo on loopback,
// per-dp-rank data, ParallelGpt), connected through one in-memory bootstrap store. The
// same modes run as processes through `drover train --nproc` in tests/integration/.
#include "worker/engine/parallel/parallel_gpt.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/job_spec.h"
#include "common/token_shard.h"
#include "tests/unit/worker/engine/emulated_device_ops.h"
#include "tests/unit/worker/engine/parallel/fake_group.h"
#include "worker/engine/eval/hellaswag.h"
#include "worker/engine/model/gpt_layout.h"
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
  std::vector<double> loss_scales;  // fp16 runs
  std::vector<bool> skipped;
  std::vector<float> params;  // global, on rank 0
  double val_loss = 0;
  // data.hellaswag scored through the same passes: each ending's summed loss, and the picks.
  std::vector<double> hellaswag_losses;
  ChoiceAccuracy hellaswag;
  double param_mib = 0;       // the rank's parameter arena
  double activation_mib = 0;  // the rank's activation sets
};

// What one run of RunWorld does.
struct Phase {
  int steps = kSteps;
  bool resume = false;      // from the newest checkpoint in checkpoint.dir
  bool checkpoint = false;  // write one (synchronously) after the steps
  // Each rank's arenas in emulated device memory (emulated_device_ops.h), its process
  // groups staging them through the host, as a multi-rank CUDA job's are.
  bool emulated_device = false;
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
    // Seven examples of 2 to 4 endings, contexts and endings of 1 to 4 tokens: 20 rows of at
    // most 8, so that the evaluation runs rows of T / 2 (ChoiceBatches), 8 a batch at
    // micro_batch 4 (three batches, the last padded; at dp 4 some data-parallel rank has
    // none). Rows of T, cut contexts among them, are HellaSwagTest's.
    std::vector<ChoiceExample> examples;
    for (int e = 0; e < 7; ++e) {
      ChoiceExample ex;
      ex.line = e + 1;
      for (int t = 0; t < 1 + e % 4; ++t) ex.context.push_back(static_cast<int32_t>(rng() % 64));
      for (int i = 0; i < 2 + e % 3; ++i) {
        ex.endings.emplace_back();
        for (int t = 0; t < 1 + (e + i) % 4; ++t) {
          ex.endings.back().push_back(static_cast<int32_t>(rng() % 64));
        }
      }
      ex.label = e % static_cast<int>(ex.endings.size());
      examples.push_back(ex);
    }
    ASSERT_TRUE(WriteChoiceFile((*dir_ / "hellaswag.bin").string(), examples).ok());
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
        ", hellaswag: " + (*dir_ / "hellaswag.bin").string() +
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
        std::unique_ptr<testing::EmulatedDeviceOps> device;
        if (phase.emulated_device) device = std::make_unique<testing::EmulatedDeviceOps>();
        TrainerOptions options;
        options.spec = spec;
        options.rank = rank;
        options.world_size = world;
        options.store = &store;
        options.log_steps = false;
        options.resume = phase.resume;
        options.ops = device.get();
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
          r.param_mib = m->param_mib;
          r.activation_mib = m->activation_mib;
          r.norms.push_back(m->grad_norm);
          r.loss_scales.push_back(m->loss_scale.value_or(0));
          r.skipped.push_back(m->skipped);
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
        auto hellaswag = (*trainer)->EvaluateHellaswag();
        if (!hellaswag.ok()) {
          r.status = hellaswag.status();
          return;
        }
        r.hellaswag = *hellaswag;
        r.hellaswag_losses = (*trainer)->hellaswag_losses();
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

  // The single-process run with the same global batch, micro-batch size and precision.
  // The model is Spec's unless `model` says otherwise (vocab_size, n_head and n_embd count).
  static const RankResult& Reference(int micro_batch, const std::string& dtype = "fp32",
                                     const ModelSpec* model = nullptr) {
    const ModelSpec base = Spec({}).model;
    if (model == nullptr) model = &base;
    using Key = std::tuple<int, std::string, int, int, int>;
    static auto* cache = new std::map<Key, RankResult>();
    const Key key{micro_batch, dtype, model->vocab_size, model->n_head, model->n_embd};
    auto it = cache->find(key);
    if (it == cache->end()) {
      JobSpec spec =
          Spec({"train.micro_batch=" + std::to_string(micro_batch), "precision.dtype=" + dtype,
                "model.vocab_size=" + std::to_string(model->vocab_size),
                "model.n_head=" + std::to_string(model->n_head),
                "model.n_embd=" + std::to_string(model->n_embd)});
      it = cache->emplace(key, RunWorld(spec, 1)[0]).first;
    }
    return it->second;
  }

  // Runs the mode and checks every rank against the single-process run of the same
  // precision. In fp32 the results agree to float rounding (relative 1e-5). In bf16 and
  // fp16 a gradient that sums in another order (over dp ranks instead of micro-batches,
  // over tp ranks instead of inside one GEMM) differs by an fp32 ulp, and a narrowed value
  // next to a rounding boundary can then land on the neighbouring bf16 value: `rtol` bounds
  // what that may add.
  //
  // `param_tol` bounds the final parameters' largest difference in fp32 (rtol when
  // negative), their mean difference in bf16 and fp16 (rtol / 100 when negative).
  static void ExpectMatchesOneProcess(int world, const std::vector<std::string>& overrides,
                                      double rtol = 1e-5, bool emulated_device = false,
                                      double param_tol = -1) {
    JobSpec spec = Spec(overrides);
    if (param_tol < 0) param_tol = spec.precision.dtype == "fp32" ? rtol : rtol / 100;
    const RankResult& want = Reference(spec.train.micro_batch, spec.precision.dtype, &spec.model);
    ASSERT_TRUE(want.status.ok()) << want.status;
    Phase phase;
    phase.emulated_device = emulated_device;
    const std::vector<RankResult> got = RunWorld(spec, world, phase);
    for (int rank = 0; rank < world; ++rank) {
      const RankResult& r = got[rank];
      ASSERT_TRUE(r.status.ok()) << "rank " << rank << ": " << r.status;
      ASSERT_EQ(r.losses.size(), want.losses.size());
      for (size_t s = 0; s < r.losses.size(); ++s) {
        EXPECT_NEAR(r.losses[s], want.losses[s], rtol * std::fabs(want.losses[s]))
            << "rank " << rank << " step " << s + 1;
        EXPECT_NEAR(r.norms[s], want.norms[s], 10 * rtol * want.norms[s])
            << "rank " << rank << " step " << s + 1;
      }
      EXPECT_NEAR(r.val_loss, want.val_loss, rtol * want.val_loss) << "rank " << rank;
      // Every rank has every ending's loss, summed over the ranks that computed them.
      ASSERT_EQ(r.hellaswag_losses.size(), 20u) << "rank " << rank;
      for (size_t e = 0; e < r.hellaswag_losses.size(); ++e) {
        EXPECT_NEAR(r.hellaswag_losses[e], want.hellaswag_losses[e],
                    rtol * want.hellaswag_losses[e])
            << "rank " << rank << " ending " << e;
      }
      EXPECT_EQ(r.hellaswag.examples, 7) << "rank " << rank;
      if (spec.precision.dtype == "fp32") {
        EXPECT_EQ(r.hellaswag.correct_mean, want.hellaswag.correct_mean) << "rank " << rank;
        EXPECT_EQ(r.hellaswag.correct_sum, want.hellaswag.correct_sum) << "rank " << rank;
      }
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
    if (spec.precision.dtype == "fp32") {
      EXPECT_LT(worst, param_tol) << "largest parameter difference at global element " << worst_i;
    } else {
      // A weight whose gradient is near zero can take AdamW's whole step (lr) either way
      // when one narrowed value moved: the mean difference is the measure here.
      double mean = 0;
      for (size_t i = 0; i < want.params.size(); ++i) {
        mean += std::fabs(got[0].params[i] - want.params[i]);
      }
      mean /= static_cast<double>(want.params.size());
      EXPECT_LT(mean, param_tol) << "largest difference " << worst << " at element " << worst_i;
    }
    for (int rank = 1; rank < world; ++rank) EXPECT_TRUE(got[rank].params.empty());
  }

  // train.recompute runs the same kernels on the same inputs, so a run that recomputes the
  // first layer of every stage, or every layer, trains exactly as the one that keeps every
  // activation: every loss, gradient norm and parameter of every rank equal bit for bit.
  static void ExpectRecomputeChangesNothing(int world, const std::vector<std::string>& overrides,
                                            bool emulated_device = false) {
    Phase phase;
    phase.emulated_device = emulated_device;
    const std::vector<RankResult> kept = RunWorld(Spec(overrides), world, phase);
    for (const char* recompute : {"1", "all"}) {
      SCOPED_TRACE(std::string("train.recompute=") + recompute);
      std::vector<std::string> o = overrides;
      o.push_back(std::string("train.recompute=") + recompute);
      const std::vector<RankResult> got = RunWorld(Spec(o), world, phase);
      for (int rank = 0; rank < world; ++rank) {
        ASSERT_TRUE(kept[rank].status.ok()) << "rank " << rank << ": " << kept[rank].status;
        ASSERT_TRUE(got[rank].status.ok()) << "rank " << rank << ": " << got[rank].status;
        EXPECT_EQ(got[rank].losses, kept[rank].losses) << "rank " << rank;
        EXPECT_EQ(got[rank].norms, kept[rank].norms) << "rank " << rank;
        EXPECT_EQ(got[rank].val_loss, kept[rank].val_loss) << "rank " << rank;
        EXPECT_EQ(got[rank].hellaswag_losses, kept[rank].hellaswag_losses) << "rank " << rank;
        EXPECT_LE(got[rank].activation_mib, kept[rank].activation_mib) << "rank " << rank;
      }
      ASSERT_EQ(got[0].params.size(), kept[0].params.size());
      size_t differ = 0, first = 0;
      for (size_t i = 0; i < kept[0].params.size(); ++i) {
        if (got[0].params[i] != kept[0].params[i] && differ++ == 0) first = i;
      }
      EXPECT_EQ(differ, 0u) << "parameters differ, the first at global element " << first;
    }
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

// Validation batches that do not split evenly over the data-parallel ranks (3 over 2): the
// rank with fewer runs a pass of padding, without which its peer's ZeRO-3 gathers of the last
// batch's parameters would wait for it until the collectives' deadline.
TEST_F(ParallelEquivalenceTest, ZeroStage3EvaluatesBatchesThatDoNotSplitEvenlyOverTheRanks) {
  const RankResult want = RunWorld(Spec({"train.micro_batch=2", "train.eval_batches=3"}), 1)[0];
  ASSERT_TRUE(want.status.ok()) << want.status;
  const std::vector<RankResult> got =
      RunWorld(Spec({"train.micro_batch=2", "parallel.zero_stage=3", "train.eval_batches=3"}), 2);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(got[rank].status.ok()) << "rank " << rank << ": " << got[rank].status;
    EXPECT_NEAR(got[rank].val_loss, want.val_loss, 1e-5 * want.val_loss) << "rank " << rank;
  }
}

// Hybrid sharding: ZeRO inside groups of 2 dp ranks, 2 replicas of them averaging their
// shards once a step. With accumulation (2 micro-batches a rank), so the replicas' average
// comes after every micro-batch's reduce-scatter, and, at ZeRO-3, the gathers stay in the
// group.
TEST_F(ParallelEquivalenceTest, HybridShardedZeroStage3) {
  ExpectMatchesOneProcess(4,
                          {"train.micro_batch=1", "parallel.zero_stage=3", "parallel.dp_shard=2"});
}

TEST_F(ParallelEquivalenceTest, HybridShardedZeroStage2WithTensorParallel) {
  ExpectMatchesOneProcess(
      8, {"train.micro_batch=1", "parallel.tp=2", "parallel.zero_stage=2", "parallel.dp_shard=2"});
}

// At stage 1, with whole gradients reduced in buckets on the last micro-batch: the
// replicas average each bucket's shard after its reduce-scatter; with a pipeline too, whose
// tied embedding is summed between its stages first.
TEST_F(ParallelEquivalenceTest, HybridShardedZeroStage1) {
  ExpectMatchesOneProcess(4,
                          {"train.micro_batch=1", "parallel.zero_stage=1", "parallel.dp_shard=2"});
}

TEST_F(ParallelEquivalenceTest, HybridShardedZeroStage1WithAPipeline) {
  ExpectMatchesOneProcess(
      8, {"train.micro_batch=1", "parallel.pp=2", "parallel.zero_stage=1", "parallel.dp_shard=2"});
}

TEST_F(ParallelEquivalenceTest, PipelineGPipe) {
  ExpectMatchesOneProcess(2,
                          {"train.micro_batch=2", "parallel.pp=2", "parallel.pp_schedule=gpipe"});
}

TEST_F(ParallelEquivalenceTest, Pipeline1F1B) {
  ExpectMatchesOneProcess(2, {"train.micro_batch=2", "parallel.pp=2", "parallel.pp_schedule=1f1b"});
}

// Two stages of two chunks (virtual stages of one layer each: stage 0 runs layers 0 and 2,
// stage 1 layers 1 and 3, handing each micro-batch back to stage 0 between its chunks),
// over 4 micro-batches and over 2 (every forward first when m == pp).
TEST_F(ParallelEquivalenceTest, InterleavedPipeline) {
  ExpectMatchesOneProcess(
      2, {"train.micro_batch=2", "parallel.pp=2", "parallel.pp_schedule=interleaved"});
  ExpectMatchesOneProcess(2, {"parallel.pp=2", "parallel.pp_schedule=interleaved"});
}

// With data parallelism and ZeRO-1 (each chunk's units reduced as its last micro-batch's
// backward makes them ready), and with tensor parallelism.
TEST_F(ParallelEquivalenceTest, InterleavedPipelineWithDataAndTensorParallelism) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.pp=2",
                              "parallel.pp_schedule=interleaved", "parallel.zero_stage=1"});
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2",
                              "parallel.pp_schedule=interleaved"});
}

TEST_F(ParallelEquivalenceTest, FourStagePipeline) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=1", "parallel.pp=4"});
}

// The vocabulary (64, padded to 128) splits in two: rank 0 holds the 64 live rows of wte,
// rank 1 only padding rows, whose logits the loss skips.
// Every loss to 1e-5. The parameters get 5e-5: on an AVX-512 machine OpenBLAS sums the
// halved GEMMs of a tp rank in another order than the whole ones of one process, and five
// AdamW steps at lr 0.01 turn that ulp into 1.18e-5 on a weight whose gradient sits near
// zero (global element 12224; under 1e-5 on the AVX2 machines this test was written on).
// A wrong slice or a missing all-reduce is off by orders of magnitude more, losses included.
TEST_F(ParallelEquivalenceTest, TensorParallel) {
  ExpectMatchesOneProcess(2, {"parallel.tp=2"}, 1e-5, false, 5e-5);
}

// 100 tokens: both halves of the split vocabulary are live (64 + 36), so the loss combines
// two real log-sum-exps and the embedding sums rows from both ranks; with a pipeline, the
// last stage's copy of wte is split the same way and summed with the first stage's.
TEST_F(ParallelEquivalenceTest, TensorParallelOverAVocabularyBothRanksHold) {
  ExpectMatchesOneProcess(2, {"parallel.tp=2", "model.vocab_size=100"});
  ExpectMatchesOneProcess(8, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2",
                              "parallel.zero_stage=1", "model.vocab_size=100"});
}

// tp 3 over a vocabulary of 450 (512 padded, 4 units of 128 rows that 3 does not divide):
// rank 0 holds rows 0-255, ranks 1 and 2 128 rows each; alone and with a pipeline, whose
// last stage's copy of wte splits the same uneven way. Every loss agrees to 1e-5. The
// parameters get 2e-4: three partial sums added in a ring round differently from one GEMM's
// sum (two parts, as every other test has, add exactly either way), and five AdamW steps at
// lr 0.01 turn that into up to 9e-5 on weights whose gradient sits near zero; tp 3 over the
// replicated vocabulary of 64, which this split does not touch, drifts by 1.1e-5 to 3.2e-5.
TEST_F(ParallelEquivalenceTest, TensorParallelOverAVocabularyTpDoesNotDivide) {
  const std::vector<std::string> model = {"model.n_head=6", "model.n_embd=48",
                                          "model.vocab_size=450", "parallel.tp=3"};
  ExpectMatchesOneProcess(3, model, 1e-5, false, 2e-4);
  std::vector<std::string> piped = model;
  piped.insert(piped.end(), {"train.micro_batch=2", "parallel.pp=2"});
  ExpectMatchesOneProcess(6, piped, 1e-5, false, 2e-4);
}

TEST_F(ParallelEquivalenceTest, DataAndPipelineParallelWithZero1) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.pp=2", "parallel.zero_stage=1"});
}

TEST_F(ParallelEquivalenceTest, DataAndTensorParallelWithZero1) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.tp=2", "parallel.zero_stage=1"});
}

TEST_F(ParallelEquivalenceTest, PipelineAndTensorParallel) {
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2"});
}

// Uneven stages (parallel.pp_layers): three layers and one, and one and three; each stage
// holds the layers it was given.
TEST_F(ParallelEquivalenceTest, PipelineOfUnevenStages) {
  ExpectMatchesOneProcess(2, {"parallel.pp=2", "parallel.pp_layers=3,1"});
  const JobSpec spec = Spec({"parallel.pp=2", "parallel.pp_layers=3,1"});
  const GptConfig config = GptConfig::FromSpec(spec.model);
  const std::vector<RankResult> ranks = RunWorld(spec, 2, {1, false, false});
  for (int stage = 0; stage < 2; ++stage) {
    auto layout = GptLayout::Create(config, stage, 2, 0, 1, {3, 1});
    ASSERT_TRUE(layout.ok() && ranks[stage].status.ok());
    EXPECT_DOUBLE_EQ(ranks[stage].param_mib, layout->num_params() * 4.0 / (1 << 20)) << stage;
  }
  ExpectMatchesOneProcess(4, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2",
                              "parallel.pp_layers=1,3", "parallel.pp_schedule=gpipe"});
}

TEST_F(ParallelEquivalenceTest, DataPipelineAndTensorParallelWithZero1) {
  ExpectMatchesOneProcess(
      8, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2", "parallel.zero_stage=1"});
}

// Checkpoints are sharded (every rank writes the ranges of the global arenas it owns) and
// universal: one written by any mesh after 3 steps resumes at any other (and in one
// process), and the next steps are the uninterrupted run's. Each resuming rank reads its dp
// share and gathers the rest (ParallelGpt::LoadParams), at every ZeRO stage.
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
      {{4, {"parallel.zero_stage=2"}},
       {one, dp2, pp2, tp2, {4, {"parallel.zero_stage=3", "parallel.dp_shard=2"}}}},
      {{4, {"parallel.pp=2", "parallel.tp=2"}},
       {one, zero3, {4, {"parallel.pp=2", "parallel.tp=2", "parallel.zero_stage=1"}}}},
      {{4, {"parallel.tp=2", "parallel.zero_stage=3"}}, {one, pp2, {2, {"parallel.zero_stage=2"}}}},
      {{4, {"parallel.pp=4"}}, {tp2, {2, {"parallel.pp=2", "parallel.pp_layers=3,1"}}}},
      {{2, {"parallel.pp=2", "parallel.pp_schedule=interleaved"}},
       {one, {4, {"parallel.pp=2", "parallel.tp=2", "parallel.pp_schedule=interleaved"}}}},
      {{4, {"parallel.zero_stage=2"}},
       {{2, {"parallel.pp=2", "parallel.pp_schedule=interleaved"}}}},
      // Hybrid sharding: each replica writes its part of its shard, and reads its part of
      // its shard resuming, the replicas gathering the rest.
      {{4, {"parallel.zero_stage=3", "parallel.dp_shard=2"}},
       {one, {4, {"parallel.zero_stage=2", "parallel.dp_shard=2"}}, tp2}},
      {{4, {"parallel.zero_stage=2", "parallel.dp_shard=2"}},
       {zero3,
        {4, {"parallel.zero_stage=3", "parallel.dp_shard=2"}},
        {4, {"parallel.zero_stage=1", "parallel.dp_shard=2"}}}},
      {{4, {"parallel.zero_stage=1", "parallel.dp_shard=2"}}, {one, dp2}},
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

// ---- mixed precision (the CPU emulates bf16 / fp16 storage by rounding) ----------------

// bf16 and fp16 train as fp32 does, within what their rounding costs, and do round: their
// losses are not fp32's.
TEST_F(ParallelEquivalenceTest, MixedPrecisionTracksFp32AndDiffersFromIt) {
  const RankResult& fp32 = Reference(4);
  ASSERT_TRUE(fp32.status.ok()) << fp32.status;
  for (const std::string dtype : {"bf16", "fp16"}) {
    SCOPED_TRACE(dtype);
    const RankResult& got = Reference(4, dtype);
    ASSERT_TRUE(got.status.ok()) << got.status;
    ASSERT_EQ(got.losses.size(), fp32.losses.size());
    double largest = 0;
    for (size_t s = 0; s < fp32.losses.size(); ++s) {
      const double rel = std::fabs(got.losses[s] - fp32.losses[s]) / fp32.losses[s];
      EXPECT_LT(rel, 0.01) << "step " << s + 1;
      largest = std::max(largest, rel);
      EXPECT_FALSE(got.skipped[s]) << "step " << s + 1;
    }
    EXPECT_GT(largest, 1e-6) << "the losses equal fp32's: nothing was narrowed";
    EXPECT_LT(got.losses.back(), got.losses.front());
  }
}

TEST_F(ParallelEquivalenceTest, Bf16DataParallelWithZero2) {
  ExpectMatchesOneProcess(
      2, {"train.micro_batch=2", "parallel.zero_stage=2", "precision.dtype=bf16"}, 2e-3);
}

// The tp ranks sum the residual stream's GEMMs in another order than one GEMM does: an fp32
// ulp apart, which the fp32 residual stream (GptStage) carries to every later rounding, so
// more narrowed values land on the neighbouring bf16 value than when each block's sum was
// itself rounded (mean parameter difference 7.0e-5 after 5 steps, 2e-5 bounded it before).
// The losses hold to 2e-3 all the same.
TEST_F(ParallelEquivalenceTest, Bf16PipelineAndTensorParallel) {
  ExpectMatchesOneProcess(
      4, {"train.micro_batch=2", "parallel.pp=2", "parallel.tp=2", "precision.dtype=bf16"}, 2e-3,
      /*emulated_device=*/false, /*param_tol=*/1.5e-4);
}

TEST_F(ParallelEquivalenceTest, Fp16DataParallelWithZero1) {
  ExpectMatchesOneProcess(
      2, {"train.micro_batch=2", "parallel.zero_stage=1", "precision.dtype=fp16"}, 2e-3);
}

// At a loss scale of 2^24 the scaled gradients overflow fp16 (largest finite 65504): the
// step is skipped on every rank and the scale halves until the gradients fit; with a window
// of 2 it doubles again after two good steps in a row.
TEST_F(ParallelEquivalenceTest, Fp16OverflowSkipsTheStepEverywhereAndHalvesTheScale) {
  JobSpec spec =
      Spec({"precision.dtype=fp16", "precision.initial_loss_scale=16777216",
            "precision.loss_scale_window=2", "train.micro_batch=2", "parallel.zero_stage=2"});
  spec.train.steps = 8;
  const std::vector<RankResult> got = RunWorld(spec, 2, {8, false, false});
  ASSERT_TRUE(got[0].status.ok()) << got[0].status;
  ASSERT_TRUE(got[1].status.ok()) << got[1].status;
  const RankResult& r = got[0];
  EXPECT_EQ(r.loss_scales, got[1].loss_scales);
  EXPECT_EQ(r.skipped, got[1].skipped);
  ASSERT_TRUE(r.skipped[0]) << "2^24 did not overflow";
  double scale = 16777216;
  int good = 0, skipped = 0;
  for (size_t s = 0; s < r.skipped.size(); ++s) {
    EXPECT_EQ(r.loss_scales[s], scale) << "step " << s + 1;
    EXPECT_TRUE(std::isfinite(r.losses[s])) << "step " << s + 1;
    if (r.skipped[s]) {
      scale /= 2;
      good = 0;
      ++skipped;
    } else if (++good == 2) {
      scale *= 2;
      good = 0;
    }
  }
  EXPECT_LT(skipped, 8) << "the scale never came down to where the gradients fit";
  for (size_t i = 0; i < r.params.size(); ++i) ASSERT_TRUE(std::isfinite(r.params[i])) << i;
}

// A fixed scale whose gradients always overflow skips every step: the weights are still
// the initial ones, bit for bit.
TEST_F(ParallelEquivalenceTest, Fp16SkippedStepsLeaveTheWeightsUntouched) {
  JobSpec spec = Spec({"precision.dtype=fp16", "precision.loss_scale=1e30", "train.micro_batch=2",
                       "parallel.zero_stage=1"});
  const std::vector<RankResult> initial = RunWorld(spec, 2, {0, false, false});
  const std::vector<RankResult> got = RunWorld(spec, 2, {3, false, false});
  ASSERT_TRUE(initial[0].status.ok()) << initial[0].status;
  ASSERT_TRUE(got[0].status.ok()) << got[0].status;
  EXPECT_EQ(got[0].skipped, std::vector<bool>(3, true));
  EXPECT_EQ(got[0].loss_scales, std::vector<double>(3, 1e30f));
  ASSERT_EQ(got[0].params.size(), initial[0].params.size());
  EXPECT_TRUE(got[0].params == initial[0].params);
}

// The loss scaler's state is part of the checkpoint: a run that resumes (at another world
// size) goes on with the scale and good-step count it had, as the uninterrupted run does.
TEST_F(ParallelEquivalenceTest, Fp16CheckpointCarriesTheLossScale) {
  const std::vector<std::string> sets = {"precision.dtype=fp16",
                                         "precision.initial_loss_scale=16777216",
                                         "precision.loss_scale_window=2", "train.micro_batch=2",
                                         "checkpoint.dir=" + (*dir_ / "ckpt-fp16").string()};
  JobSpec spec = Spec(sets);
  spec.train.steps = 8;
  const RankResult want = RunWorld(spec, 1, {8, false, false})[0];
  ASSERT_TRUE(want.status.ok()) << want.status;
  const auto saved = RunWorld(spec, 2, {4, false, true});
  ASSERT_TRUE(saved[0].status.ok()) << saved[0].status;
  const RankResult got = RunWorld(spec, 1, {4, true, false})[0];
  ASSERT_TRUE(got.status.ok()) << got.status;
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(saved[0].loss_scales[s], want.loss_scales[s]) << "step " << s + 1;
    EXPECT_EQ(got.loss_scales[s], want.loss_scales[4 + s]) << "step " << 5 + s;
    EXPECT_EQ(got.skipped[s], want.skipped[4 + s]) << "step " << 5 + s;
    EXPECT_NEAR(got.losses[s], want.losses[4 + s], 2e-3 * want.losses[4 + s]) << "step " << 5 + s;
  }
  EXPECT_NE(want.loss_scales[4], 16777216.0) << "the scale at the checkpoint is the initial one";
}

}  // namespace
}  // namespace drover::engine::parallel

namespace drover::engine::parallel {
namespace {

// Device memory (emulated): every parallel mode keeps its arenas where a GPU would, moves
// them only through Ops and the staging communicators, and still equals one CPU process.
// A host access of device memory kills the test with a SIGSEGV that names it.
TEST_F(ParallelEquivalenceTest, EmulatedDeviceOneProcessEqualsTheCpuBitForBit) {
  JobSpec spec = Spec({});
  const RankResult& want = Reference(spec.train.micro_batch);
  Phase phase;
  phase.emulated_device = true;
  const RankResult got = RunWorld(spec, 1, phase)[0];
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.losses, want.losses);
  EXPECT_EQ(got.params, want.params);
}
TEST_F(ParallelEquivalenceTest, EmulatedDeviceDataParallelWithZero2) {
  ExpectMatchesOneProcess(2, {"parallel.zero_stage=2"}, 1e-5, /*emulated_device=*/true);
}
TEST_F(ParallelEquivalenceTest, EmulatedDeviceZeroStage3WithAccumulation) {
  ExpectMatchesOneProcess(2, {"parallel.zero_stage=3", "train.micro_batch=2"}, 1e-5, true);
}
TEST_F(ParallelEquivalenceTest, EmulatedDeviceHybridShardedZeroStage3) {
  ExpectMatchesOneProcess(
      4, {"parallel.zero_stage=3", "parallel.dp_shard=2", "train.micro_batch=1"}, 1e-5, true);
}
TEST_F(ParallelEquivalenceTest, EmulatedDeviceHybridShardedZeroStage1) {
  ExpectMatchesOneProcess(
      4, {"parallel.zero_stage=1", "parallel.dp_shard=2", "train.micro_batch=1"}, 1e-5, true);
}
TEST_F(ParallelEquivalenceTest, EmulatedDeviceDataParallelWithZero1) {
  ExpectMatchesOneProcess(2, {"parallel.zero_stage=1"}, 1e-5, true);
}
TEST_F(ParallelEquivalenceTest, EmulatedDevicePipelineAndTensorParallel) {
  ExpectMatchesOneProcess(4, {"parallel.pp=2", "parallel.tp=2", "train.micro_batch=2"}, 1e-5, true);
}
TEST_F(ParallelEquivalenceTest, EmulatedDeviceInterleavedPipeline) {
  ExpectMatchesOneProcess(
      2, {"parallel.pp=2", "parallel.pp_schedule=interleaved", "train.micro_batch=2"}, 1e-5, true);
}
// A checkpoint written from device memory (ZeRO-3 shards, gathered through ToHost) resumes
// on the CPU, and one written on the CPU resumes on the device, both continuing the
// uninterrupted run.
TEST_F(ParallelEquivalenceTest, EmulatedDeviceCheckpointsMoveBetweenDeviceAndCpu) {
  const RankResult& want = Reference(2);
  ASSERT_TRUE(want.status.ok()) << want.status;
  for (const bool save_on_device : {true, false}) {
    SCOPED_TRACE(save_on_device ? "saved on the device" : "saved on the cpu");
    const std::string ckpt =
        "checkpoint.dir=" + (*dir_ / (save_on_device ? "ckpt_dev" : "ckpt_cpu")).string();
    Phase save{3, false, true, save_on_device};
    const auto saved =
        RunWorld(Spec({"train.micro_batch=2", "parallel.zero_stage=3", ckpt}), 2, save);
    ASSERT_TRUE(saved[0].status.ok()) << saved[0].status;
    Phase load{2, true, false, !save_on_device};
    const auto got = RunWorld(Spec({"train.micro_batch=2", "parallel.tp=2", ckpt}), 2, load);
    ASSERT_TRUE(got[0].status.ok()) << got[0].status;
    ASSERT_EQ(got[0].losses.size(), 2u);
    for (int s = 0; s < 2; ++s) {
      EXPECT_NEAR(got[0].losses[s], want.losses[3 + s], 1e-5 * want.losses[3 + s]) << s;
    }
  }
}

TEST_F(ParallelEquivalenceTest, EmulatedDeviceBf16DataParallel) {
  ExpectMatchesOneProcess(2, {"precision.dtype=bf16"}, 2e-3, true);
}

// ---- train.recompute: activations recomputed in backward instead of kept ----

TEST_F(ParallelEquivalenceTest, RecomputeTrainsAsKeepingTheActivations) {
  ExpectRecomputeChangesNothing(1, {});
  ExpectRecomputeChangesNothing(1, {"train.micro_batch=2", "precision.dtype=bf16"});
  ExpectRecomputeChangesNothing(1, {"precision.dtype=fp16"});
}
// The recomputed attention projection all-reduces again over tp; ZeRO-3 recomputes with the
// parameters it gathered for the layer's backward.
TEST_F(ParallelEquivalenceTest, RecomputeUnderTensorParallelismAndZero3) {
  ExpectRecomputeChangesNothing(2, {"parallel.tp=2"});
  ExpectRecomputeChangesNothing(2, {"train.micro_batch=2", "parallel.zero_stage=3"});
}
// Several micro-batches in flight per stage, each with its own activations; under the
// interleaved schedule each chunk recomputes its own first layers.
TEST_F(ParallelEquivalenceTest, RecomputeInPipelines) {
  ExpectRecomputeChangesNothing(2, {"train.micro_batch=2", "parallel.pp=2"});
  ExpectRecomputeChangesNothing(4, {"train.micro_batch=2", "parallel.pp=2",
                                    "parallel.pp_schedule=interleaved", "parallel.tp=2"});
}
TEST_F(ParallelEquivalenceTest, EmulatedDeviceRecomputeWithBf16AndZero2) {
  ExpectRecomputeChangesNothing(2, {"precision.dtype=bf16", "parallel.zero_stage=2"}, true);
}

// Each recomputed layer gives back one layer's activation buffers but the last: recomputing
// all four layers of the model keeps one layer's, as recomputing three does.
TEST_F(ParallelEquivalenceTest, EachRecomputedLayerFreesOneLayersActivations) {
  std::map<std::string, double> mib;
  for (const char* recompute : {"none", "1", "2", "3", "all"}) {
    const RankResult r =
        RunWorld(Spec({std::string("train.recompute=") + recompute}), 1, Phase{/*steps=*/1})[0];
    ASSERT_TRUE(r.status.ok()) << recompute << ": " << r.status;
    mib[recompute] = r.activation_mib;
  }
  const double layer = mib["none"] - mib["1"];
  EXPECT_GT(layer, 0);
  EXPECT_DOUBLE_EQ(mib["1"] - mib["2"], layer);
  EXPECT_DOUBLE_EQ(mib["2"] - mib["3"], layer);
  EXPECT_DOUBLE_EQ(mib["all"], mib["3"]);
  // A layer's buffers are most of what a 4-layer model's activations take (the rest: every
  // layer's output, the embedding, the head's logits and the backward's scratch).
  EXPECT_GT(3 * layer, 0.5 * mib["none"]) << "none " << mib["none"] << " MiB, all " << mib["all"];
}

// A group of two, this rank its first, whose peer always holds what this rank holds: an
// average leaves the data as it is, a sum doubles it, a gather copies this rank's chunk. Its calls
// return OK; Sync returns `sync`, as a stream-ordered group (NCCL) reports a transfer that failed
// after its call returned.
class MirrorGroup final : public testing::FakeGroup {
 public:
  explicit MirrorGroup(std::string name) : FakeGroup(std::move(name), 2) {}
  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override {
    if (op == ReduceOp::kAverage) return OkStatus();
    for (size_t i = 0; i < count; ++i) {
      if (type == DataType::kFloat64) {
        static_cast<double*>(data)[i] *= 2;
      } else {
        static_cast<float*>(data)[i] *= 2;
      }
    }
    return OkStatus();
  }
  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp op) override {
    return AllReduce(data, counts[0], type, op);  // this rank's chunk, the first
  }
  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    auto* bytes = static_cast<std::byte*>(data);
    const size_t n = counts[0] * SizeOf(type);
    std::copy(bytes, bytes + n, bytes + n);  // the peer's chunk: a copy of this rank's
    return OkStatus();
  }
  Status Broadcast(void*, size_t, DataType, int) override { return OkStatus(); }
  Status Sync() override { return sync; }

  Status sync;
};

// A step trusts its collectives' results only once every group synced (Communicator::Sync):
// a transfer that a stream-ordered group aborted after its call returned leaves garbage in
// its buffer, and the step fails before its optimizer update, leaving the weights as they
// were (nor do its loss and norm reach the metrics).
TEST(ParallelGptTest, AStepWhoseGroupFailsAfterItsCallsReturnedFailsBeforeTheOptimizer) {
  JobSpec spec;
  spec.model.n_layer = 2;
  spec.model.n_head = 2;
  spec.model.n_embd = 16;
  spec.model.block_size = 8;
  spec.model.vocab_size = 32;
  spec.parallel.dp = 2;
  spec.train.global_batch = 2;
  spec.train.micro_batch = 1;
  spec.train.seq_len = 8;
  auto mesh = ParallelMesh::Create(spec, 2);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ProcessGroups groups;
  auto* world = new MirrorGroup("world");
  groups.world.reset(world);
  groups.dp = std::make_unique<MirrorGroup>("dp.pp0.tp0");
  ParallelGptOptions options;
  options.config = GptConfig::FromSpec(spec.model);
  options.micro_batch = 1;
  options.seq_len = 8;
  auto model = ParallelGpt::Create(options, *mesh, &groups, CpuOps());
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> start((*model)->layout().global_num_params());
  for (size_t i = 0; i < start.size(); ++i) start[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  (*model)->LoadGlobalParams(start.data());
  const auto batch = [](int32_t* inputs, int32_t* targets) {
    for (int t = 0; t < 8; ++t) {
      inputs[t] = t;
      targets[t] = t + 1;
    }
    return OkStatus();
  };
  auto first = (*model)->Step(batch, 1e-3);
  ASSERT_TRUE(first.ok()) << first.status();
  const ParallelGpt::OwnedState before = (*model)->ExportOwned();

  world->sync = DeadlineExceededError("nccl group \"world\": a transfer was aborted");
  auto failed = (*model)->Step(batch, 1e-3);
  EXPECT_EQ(failed.status().code(), StatusCode::kDeadlineExceeded) << failed.status();
  const ParallelGpt::OwnedState after = (*model)->ExportOwned();
  EXPECT_TRUE(before.params == after.params) << "the failed step updated the weights";
}

}  // namespace
}  // namespace drover::engine::parallel
