#include "worker/engine/optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace drover::engine {
namespace {

TEST(HasNonFiniteTest, FindsInfAndNanAnywhere) {
  std::vector<float> g(1000, 0.5f);
  EXPECT_FALSE(HasNonFinite(g.data(), g.size()));
  g[999] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(HasNonFinite(g.data(), g.size()));
  EXPECT_FALSE(HasNonFinite(g.data(), 999));  // range-limited
  g[999] = 0;
  g[3] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(HasNonFinite(g.data(), g.size()));
  g[3] = std::nanf("");
  EXPECT_TRUE(HasNonFinite(g.data(), g.size()));
  g[3] = std::numeric_limits<float>::max();
  EXPECT_FALSE(HasNonFinite(g.data(), g.size()));
}

TEST(DynamicLossScalerTest, StartsAtTwoToTheSixteen) {
  DynamicLossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0f);
}

// Scales a "true" gradient by the loss scale in fp16 range and reports overflow, as the
// trainer would after backward.
bool Overflows(float true_grad, float scale) {
  const float scaled = true_grad * scale;
  return !(std::abs(scaled) <= 65504.0f);  // fp16 max
}

TEST(DynamicLossScalerTest, InjectedOverflowSkipsStepAndBacksOff) {
  DynamicLossScaler scaler;
  // A gradient of 4.0 overflows fp16 at scale 2^16, 2^15, 2^14; fits at 2^13 (4 * 8192 = 32768).
  int skipped = 0;
  while (!scaler.Update(Overflows(4.0f, scaler.scale()))) ++skipped;
  EXPECT_EQ(skipped, 3);
  EXPECT_EQ(scaler.scale(), 8192.0f);
  EXPECT_EQ(scaler.state().skipped_steps, 3);
  EXPECT_EQ(scaler.state().good_steps, 1);
}

TEST(DynamicLossScalerTest, GrowsAfterIntervalOfGoodStepsAndResetsOnOverflow) {
  LossScalerConfig config;
  config.growth_interval = 5;
  config.initial_scale = 1024;
  DynamicLossScaler scaler(config);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 2048.0f);
  EXPECT_EQ(scaler.state().good_steps, 0);
  // An overflow in the middle of a window restarts the count.
  for (int i = 0; i < 3; ++i) scaler.Update(false);
  EXPECT_FALSE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  for (int i = 0; i < 4; ++i) scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 1024.0f);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 2048.0f);
}

TEST(DynamicLossScalerTest, DefaultGrowthIntervalIs2000) {
  DynamicLossScaler scaler;
  for (int i = 0; i < 1999; ++i) scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 131072.0f);
}

TEST(DynamicLossScalerTest, NeverBacksOffBelowMinimum) {
  LossScalerConfig config;
  config.initial_scale = 8;
  config.min_scale = 1;
  DynamicLossScaler scaler(config);
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_EQ(scaler.state().skipped_steps, 10);
}

TEST(DynamicLossScalerTest, StaticScalerSkipsButKeepsScale) {
  LossScalerConfig config;
  config.dynamic = false;
  config.initial_scale = 128;
  config.growth_interval = 1;
  DynamicLossScaler scaler(config);
  EXPECT_FALSE(scaler.Update(true));
  EXPECT_TRUE(scaler.Update(false));
  EXPECT_TRUE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 128.0f);
}

TEST(DynamicLossScalerTest, StateRestoresExactly) {
  LossScalerConfig config;
  config.growth_interval = 3;
  DynamicLossScaler a(config);
  a.Update(true);
  a.Update(false);
  a.Update(false);
  DynamicLossScaler b(config);
  ASSERT_TRUE(b.Restore(a.state()).ok());
  // One more good step grows both identically.
  EXPECT_EQ(a.Update(false), b.Update(false));
  EXPECT_EQ(a.scale(), 65536.0f);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.state().skipped_steps, 1);

  LossScalerState bad;
  bad.scale = std::numeric_limits<float>::infinity();
  EXPECT_EQ(b.Restore(bad).code(), StatusCode::kInvalidArgument);
  bad.scale = 2;
  bad.good_steps = -1;
  EXPECT_EQ(b.Restore(bad).code(), StatusCode::kInvalidArgument);
}

TEST(LossScalerConfigTest, ValidateNamesTheField) {
  LossScalerConfig config;
  config.backoff_factor = 1.5f;
  const Status st = config.Validate();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("backoff_factor"), std::string::npos);
  config = {};
  config.growth_interval = 0;
  EXPECT_NE(config.Validate().message().find("growth_interval"), std::string::npos);
}

}  // namespace
}  // namespace drover::engine
