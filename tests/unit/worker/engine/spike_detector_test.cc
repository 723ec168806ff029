#include "worker/engine/spike_detector.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace drover::engine {
namespace {

SpikeRollbackSpec Spec(double factor, int window) {
  SpikeRollbackSpec s;
  s.enabled = true;
  s.factor = factor;
  s.window = window;
  return s;
}

TEST(SpikeDetectorTest, NonFiniteLossIsASpikeEvenBeforeTheWindowFills) {
  SpikeDetector d(Spec(3, 4));
  EXPECT_TRUE(d.Observe(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_TRUE(d.Observe(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(d.Observe(100.0));  // window not full: no baseline yet
}

TEST(SpikeDetectorTest, SpikeIsJudgedAgainstTheFullWindowAndDoesNotEnterIt) {
  SpikeDetector d(Spec(2, 3));
  for (double l : {1.0, 1.0, 1.0}) EXPECT_FALSE(d.Observe(l));
  EXPECT_FALSE(d.Observe(2.0));  // not above 2 x 1.0
  EXPECT_DOUBLE_EQ(d.mean(), 4.0 / 3.0);
  EXPECT_TRUE(d.Observe(2.7));  // above 2 x 4/3
  EXPECT_DOUBLE_EQ(d.mean(), 4.0 / 3.0);
  d.Reset();
  EXPECT_FALSE(d.Observe(50.0));
  EXPECT_DOUBLE_EQ(d.mean(), 50.0);
}

TEST(SpikeDetectorTest, WindowSlides) {
  SpikeDetector d(Spec(3, 2));
  for (double l : {10.0, 10.0, 1.0, 1.0}) EXPECT_FALSE(d.Observe(l));
  EXPECT_DOUBLE_EQ(d.mean(), 1.0);
  EXPECT_TRUE(d.Observe(3.5));
}

}  // namespace
}  // namespace drover::engine
