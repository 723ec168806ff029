#include "worker/engine/model/gpt_inference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/unit/worker/engine/emulated_device_ops.h"

namespace drover::engine {
namespace {

// maxT 16, V 37 (Vp 64), L 2, NH 2, C 16.
GptConfig Tiny() { return GptConfig{16, 37, 64, 2, 2, 16}; }

struct Batch {
  int B, T;
  std::vector<int32_t> inputs, targets;
};

Batch MakeBatch(int B, int T) {
  Batch b{B, T, {}, {}};
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back((i * 7 + 3) % 37);
    b.targets.push_back((i * 11 + 5) % 37);
  }
  return b;
}

// On the CPU table the passes are Gpt's own: the same loss to the bit, and each position's
// loss its log-softmax.
TEST(GptInferenceTest, OnTheCpuItGivesTheModelsOwnLosses) {
  Gpt model(Tiny());
  model.InitRandom(3);
  GptInference run(model, CpuOps());
  const Batch b = MakeBatch(3, 12);
  std::vector<float> losses(b.inputs.size());
  const float loss = run.Loss(b.inputs.data(), b.targets.data(), b.B, b.T, losses.data());
  EXPECT_EQ(loss, model.Forward(b.inputs.data(), b.targets.data(), b.B, b.T));
  // The logits of that Forward: each position's loss is -log softmax at its target.
  const int Vp = model.config().padded_vocab_size, V = model.config().vocab_size;
  double mean = 0;
  for (size_t n = 0; n < losses.size(); ++n) {
    const float* l = model.logits() + n * Vp;
    double z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(static_cast<double>(l[v]));
    const double want = std::log(z) - l[b.targets[n]];
    EXPECT_NEAR(losses[n], want, 1e-5) << "position " << n;
    mean += losses[n];
  }
  EXPECT_NEAR(mean / losses.size(), loss, 1e-6);
}

// On a table whose memory is a device's (a host access to it faults: EmulatedDeviceOps) the
// parameters are copied in and the losses copied out: the CPU's results bit for
// bit, since that table's arithmetic is the CPU's. In fp32 and in bf16, where the weights are
// read narrowed (NarrowedParams): a bf16 loss near the fp32 one but not it.
TEST(GptInferenceTest, OnDeviceMemoryItGivesTheCpusResultsInEachPrecision) {
  Gpt model(Tiny());
  model.InitRandom(4);
  testing::EmulatedDeviceOps device;
  const Batch b = MakeBatch(2, 16);
  float fp32_loss = 0;
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    GptInference cpu(model, CpuOps(), p);
    GptInference dev(model, &device, p);
    EXPECT_STREQ(dev.device(), "emulated-device");
    std::vector<float> cpu_losses(b.inputs.size()), dev_losses(b.inputs.size());
    const float cpu_loss = cpu.Loss(b.inputs.data(), b.targets.data(), b.B, b.T, cpu_losses.data());
    EXPECT_EQ(dev.Loss(b.inputs.data(), b.targets.data(), b.B, b.T, dev_losses.data()), cpu_loss)
        << PrecisionName(p);
    EXPECT_EQ(dev_losses, cpu_losses) << PrecisionName(p);
    if (p == Precision::kFp32) {
      fp32_loss = cpu_loss;
    } else {
      EXPECT_NE(cpu_loss, fp32_loss) << PrecisionName(p);
      EXPECT_NEAR(cpu_loss, fp32_loss, 0.02 * fp32_loss) << PrecisionName(p);
    }
  }
}

// Activation memory grows for a larger (B, T) and serves a smaller one after it: each pass
// gives what a fresh GptInference gives.
TEST(GptInferenceTest, PassesOfEveryShapeGiveWhatAFreshRunGives) {
  Gpt model(Tiny());
  model.InitRandom(5);
  GptInference kept(model, CpuOps());
  for (auto [B, T] : {std::pair{1, 4}, {4, 16}, {2, 7}}) {
    const Batch b = MakeBatch(B, T);
    GptInference fresh(model, CpuOps());
    EXPECT_EQ(kept.Loss(b.inputs.data(), b.targets.data(), B, T),
              fresh.Loss(b.inputs.data(), b.targets.data(), B, T))
        << B << " x " << T;
  }
}

}  // namespace
}  // namespace drover::engine
