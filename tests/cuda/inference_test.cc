// GptInference (drover eval --device cuda) and GptDecoder (drover sample --device cuda) on the
// CUDA table against the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/cuda/cuda_ops_fixture.h"
#include "worker/engine/model/gpt_decoder.h"
#include "worker/engine/model/gpt_inference.h"

namespace drover::engine {
namespace {

// A model's losses and each position's loss (what HellaSwag sums): the GPU's against the
// CPU's, in fp32 and in bf16 (which reads the weights narrowed, on each
// table in its own way; a value next to a rounding boundary may land on the other side, hence
// the looser bound, as in the training test's).
TEST_F(CudaOpsTest, InferenceLossesMatchTheCpu) {
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
  }
}

// The sampler's logits through the decoder's key/value cache on the GPU against the CPU's
// decoder: a prefill, tokens one at a time against the cache, a context that changes inside
// the cache, and the window sliding past maxT (each token a prefill again).
TEST_F(CudaOpsTest, DecoderLogitsMatchTheCpu) {
  Gpt model(GptConfig{32, 64, 128, 2, 4, 64});  // maxT, V, Vp, L, NH, C
  model.InitRandom(12);
  GptDecoder cpu(model, cpu_), gpu(model, gpu_);
  std::vector<int32_t> context = RandomTargets(20, 64);
  for (int step = 0; step < 20; ++step) {
    if (step == 5) context[10] = (context[10] + 1) % 64;
    const int n = static_cast<int>(context.size());
    ExpectClose(gpu.NextTokenLogits(context.data(), n), cpu.NextTokenLogits(context.data(), n),
                "logits after " + std::to_string(n) + " tokens", 1e-4, 1e-4);
    EXPECT_EQ(gpu.computed(), cpu.computed()) << n;
    context.push_back((step * 7 + 3) % 64);
  }
}

}  // namespace
}  // namespace drover::engine
