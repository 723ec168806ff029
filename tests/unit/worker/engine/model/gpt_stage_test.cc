#include "worker/engine/model/gpt_stage.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/model/stage_memory.h"

namespace drover::engine {
namespace {

// A tiny whole model on the CPU table, parameters narrowed to the precision as a run's
// memory gives them.
struct TinyStage {
  explicit TinyStage(Precision p)
      : layout(GptLayout::Whole(GptConfig{8, 37, 40, 2, 2, 16})),
        params(layout.num_params()),
        grads(layout.num_params()),
        memory(&layout, CpuOps(), params.data(), grads.data()),
        stage(&layout, CpuOps(), /*tp=*/nullptr, p),
        acts(&layout, CpuOps(), p) {
    InitGptParams(layout.config(), 5, params.data());
    if (p != Precision::kFp32) CpuOps()->Round(params.data(), params.size(), p);
    acts.Ensure(kB, kT);
    for (int i = 0; i < kB * kT; ++i) {
      acts.inputs()[i] = (7 * i + 3) % 37;
      acts.targets()[i] = (5 * i + 1) % 37;
    }
  }

  static constexpr int kB = 2, kT = 8;
  GptLayout layout;
  std::vector<float> params, grads;
  FlatStageMemory memory;
  GptStage stage;
  StageActivations acts;
};

// Given Backward's grad_scale, the training Forward takes the loss's gradient in the same
// call as the loss (Ops::CrossEntropyForwardBackward): the same loss and the same gradients,
// bit for bit, as the Forward that leaves it to Backward (the CPU table's fused call is its
// two calls).
TEST(GptStageTest, ASeededForwardTrainsAsTheBackwardSeedsIt) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    SCOPED_TRACE(PrecisionName(p));
    const float grad_scale = p == Precision::kFp16 ? 1024.0f : 0.5f;
    TinyStage plain(p), seeded(p);
    plain.memory.ZeroGrad();
    seeded.memory.ZeroGrad();
    auto a = plain.stage.Forward(plain.acts, plain.memory, GptStage::Pass::kTrain);
    auto b = seeded.stage.Forward(seeded.acts, seeded.memory, GptStage::Pass::kTrain, grad_scale);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    ASSERT_TRUE(plain.stage.Backward(plain.acts, plain.memory, grad_scale).ok());
    ASSERT_TRUE(seeded.stage.Backward(seeded.acts, seeded.memory, grad_scale).ok());
    plain.memory.MaterializeZeros();
    seeded.memory.MaterializeZeros();
    ASSERT_EQ(plain.grads, seeded.grads);
    double norm = 0;
    for (float g : seeded.grads) norm += double{g} * g;
    EXPECT_GT(norm, 0.0);
  }
}

TEST(GptStageDeathTest, BackwardWithAnotherSeedThanTheForwardsDies) {
  TinyStage s(Precision::kFp32);
  s.memory.ZeroGrad();
  ASSERT_TRUE(s.stage.Forward(s.acts, s.memory, GptStage::Pass::kTrain, 0.5f).ok());
  EXPECT_DEATH((void)s.stage.Backward(s.acts, s.memory, 0.25f), "grad_scale is not the Forward's");
}

}  // namespace
}  // namespace drover::engine
