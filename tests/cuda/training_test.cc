// 20 training steps of a small model on the CUDA table against the same steps on the CPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/token_shard.h"
#include "tests/cuda/cuda_ops_fixture.h"
#include "worker/engine/trainer.h"

namespace drover::engine {
namespace {

// `steps` steps of a small GPT at sequence length T through the whole trainer, on the GPU and
// on the CPU, in `dtype`: every step's loss within rtol, the same loss scales (fp16), and no
// device allocation in a step after the second.
// rng: the fixture's, for the tokens.
void CompareWithTheCpu(std::mt19937& rng, const std::string& dtype, double rtol, int T, int steps) {
  namespace fs = std::filesystem;
  // One directory per process: ctest runs these tests in two binaries' runs at once
  // (Emulated.CudaOpsTest.EveryOpOnFp32Inputs takes every CudaOpsTest too).
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("cuda_ops_test_train." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = rng() % 6 == 0 ? rng() % 64 : static_cast<uint16_t>((i * 5 + i / 7) % 61);
  }
  ASSERT_TRUE(WriteTokenShard((dir / "train.bin").string(), tokens).ok());
  std::vector<std::vector<double>> losses;
  std::vector<std::string> scales;  // fp16: each step's loss scale, "skipped" where it was
  for (const std::string device : {"cpu", "cuda"}) {
    auto spec = ParseJobSpec(
        "name: cuda-check\noutput_dir: " + (dir / (device + dtype)).string() +
            "\nmodel: {n_layer: 2, n_head: 4, n_embd: 64, block_size: " + std::to_string(T) +
            ", vocab_size: 64}\ndata: {train: " + (dir / "train.bin").string() +
            "}\ntrain: {steps: " + std::to_string(steps) +
            ", global_batch: 8, micro_batch: 4, seq_len: " + std::to_string(T) +
            ", lr: 0.003, warmup_steps: 2, eval_every: 0, seed: 5}\n"
            "checkpoint: {every_steps: 0}\nprecision: {dtype: " +
            dtype + "}\nresources: {device: " + device + "}\n",
        {});
    ASSERT_TRUE(spec.ok()) << spec.status();
    TrainerOptions options;
    options.spec = *spec;
    options.log_steps = false;
    auto trainer = Trainer::Create(options);
    ASSERT_TRUE(trainer.ok()) << device << ": " << trainer.status();
    losses.emplace_back();
    scales.emplace_back();
    for (int s = 0; s < steps; ++s) {
      auto m = (*trainer)->Step();
      ASSERT_TRUE(m.ok()) << device << ": " << m.status();
      losses.back().push_back(m->loss);
      if (m->loss_scale.has_value()) {
        scales.back() += std::to_string(*m->loss_scale) + (m->skipped ? " skipped, " : ", ");
      }
      // The scratch buffers grow in the first steps; then no step allocates device memory
      // (a cudaMalloc synchronises the whole GPU).
      EXPECT_EQ(m->device_allocations.has_value(), device == "cuda");
      if (s >= 2) {
        EXPECT_EQ(m->device_allocations.value_or(0), 0) << dtype << " step " << s + 1;
      }
      // What the table holds covers the arenas the step reports, and its peak what it holds.
      EXPECT_EQ(m->device_mib.has_value(), device == "cuda");
      if (device == "cuda") {
        const double arenas = m->param_mib + m->grad_mib + m->optimizer_mib + m->activation_mib;
        EXPECT_GE(m->device_mib.value_or(0), arenas) << dtype << " step " << s + 1;
        EXPECT_GE(m->device_peak_mib.value_or(0), m->device_mib.value_or(0)) << dtype;
      }
    }
  }
  // fp16's dynamic loss scaler skips and backs off at the same steps on both.
  EXPECT_EQ(scales[1], scales[0]) << dtype;
  EXPECT_EQ(scales[0].empty(), dtype != "fp16") << dtype << ": " << scales[0];
  for (int s = 0; s < steps; ++s) {
    EXPECT_NEAR(losses[1][s], losses[0][s], rtol * losses[0][s]) << dtype << " step " << s + 1;
  }
  EXPECT_LT(losses[1].back(), losses[1].front()) << dtype;
  fs::remove_all(dir);
}

// 20 steps in fp32, in bf16 and in fp16 with the dynamic loss scaler (both store floats
// rounded to the 16-bit type; a value next to a rounding boundary may land on the other side
// on one of them, hence the looser bound).
// On fp32 GEMM inputs (Fp32GemmInputs) the fp32 run would repeat the default one's.
TEST_F(CudaOpsTest, TwentyTrainingStepsMatchTheCpu) {
  for (const auto& [dtype, rtol] : std::vector<std::pair<std::string, double>>{
           {"fp32", 1e-4}, {"bf16", 5e-3}, {"fp16", 5e-3}}) {
    if (Fp32GemmInputs() && dtype == "fp32") continue;
    CompareWithTheCpu(rng_, dtype, rtol, 32, 20);
  }
}

// At T=128, a sequence cuDNN's fused attention takes, in bf16: run with DROVER_CUDA_ATTENTION=cudnn
// (the ctest entry ...ThroughCudnn, check.sh's step 2b). Elsewhere it would repeat the 20-step
// test at four times its cost on the emulator, so it skips.
TEST_F(CudaOpsTest, TenTrainingStepsAtT128MatchTheCpu) {
  const char* choice = std::getenv("DROVER_CUDA_ATTENTION");
  if (choice == nullptr || std::string(choice) != "cudnn") {
    GTEST_SKIP() << "run with DROVER_CUDA_ATTENTION=cudnn";
  }
  CompareWithTheCpu(rng_, "bf16", 5e-3, 128, 10);
}

}  // namespace
}  // namespace drover::engine
