// GptInference (drover eval and drover sample --device cuda) on the CUDA table against the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/cuda/cuda_ops_fixture.h"
#include "worker/engine/model/gpt_inference.h"

namespace drover::engine {
namespace {

// A model's losses, each position's loss (what HellaSwag sums) and the sampler's logits: the
// GPU's against the CPU's, in fp32 and in bf16 (which reads the weights narrowed, on each
// table in its own way; a value next to a rounding boundary may land on the other side, hence
// the looser bound, as in the training test's).
TEST_F(CudaOpsTest, InferenceLossesAndLogitsMatchTheCpu) {
  Gpt model(GptConfig{32, 64, 128, 2, 4, 64});  // maxT, V, Vp, L, NH, C
  model.InitRandom(11);
  const int B = 3, T = 32;
  const std::vector<int32_t> inputs = RandomTargets(B * T, 64);
  const std::vector<int32_t> targets = RandomTargets(B * T, 64);
  for (const auto& [p, rtol] : std::vector<std::pair<Precision, double>>{
           {Precision::kFp32, 1e-4}, {Precision::kBf16, 1e-2}}) {
    const std::string name = PrecisionName(p);
    GptInference cpu(model, cpu_, p), gpu(model, gpu_, p);
    EXPECT_STREQ(gpu.device(), "cuda");
    std::vector<float> cpu_losses(B * T), gpu_losses(B * T);
    const float want = cpu.Loss(inputs.data(), targets.data(), B, T, cpu_losses.data());
    const float got = gpu.Loss(inputs.data(), targets.data(), B, T, gpu_losses.data());
    EXPECT_NEAR(got, want, rtol * want) << name;
    ExpectClose(gpu_losses, cpu_losses, "per-position losses " + name, rtol, 1e-4);
    if (p == Precision::kFp32) {
      for (int n : {1, 17, 40}) {  // 40 > maxT: the last 32 tokens
        ExpectClose(gpu.NextTokenLogits(inputs.data(), n), cpu.NextTokenLogits(inputs.data(), n),
                    "logits after " + std::to_string(n) + " tokens", 1e-4, 1e-4);
      }
    }
  }
}

}  // namespace
}  // namespace drover::engine
