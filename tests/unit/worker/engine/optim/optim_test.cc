// AdamW, the learning-rate schedule and gradient clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/grad_clip.h"
#include "worker/engine/optim/lr_schedule.h"

namespace drover::engine {
namespace {

// A hand-written double-precision AdamW, the oracle for the float implementation.
struct ReferenceAdamW {
  std::vector<double> m, v;
  int64_t t = 0;
  void Step(std::vector<double>& p, const std::vector<double>& g, const std::vector<bool>& decay,
            double lr, double b1, double b2, double eps, double wd) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(b1, double(t)));
      const double v_hat = v[i] / (1 - std::pow(b2, double(t)));
      p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + (decay[i] ? wd : 0.0) * p[i]);
    }
  }
};

struct FakeTensor {
  size_t offset, numel;
  bool decay;
};

// Parameters and gradients that differ per element and per step.
double InitParam(size_t i) { return 0.5 * std::sin(0.7 * double(i) + 0.3); }
double Grad(size_t i, int step) {
  return 0.1 * std::cos(1.3 * double(i) - 0.9 * step) + 0.01 * step;
}

TEST(AdamWTest, MatchesDoubleReferenceOverSeveralSteps) {
  const std::vector<FakeTensor> tensors = {
      {0, 6, true}, {6, 3, false}, {9, 8, true}, {17, 2, false}};
  const size_t n = 19;
  AdamWConfig config{0.9f, 0.99f, 1e-8f, 0.1f};
  AdamW opt(tensors, n, config);
  std::vector<float> p(n), g(n);
  std::vector<double> pd(n), gd(n);
  std::vector<bool> decay(n);
  for (const FakeTensor& t : tensors)
    for (size_t i = t.offset; i < t.offset + t.numel; ++i) decay[i] = t.decay;
  for (size_t i = 0; i < n; ++i) p[i] = float(pd[i] = InitParam(i));
  ReferenceAdamW ref;
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < n; ++i) g[i] = float(gd[i] = float(Grad(i, step)));
    const double lr = 1e-2 * (step + 1);
    opt.Step(p.data(), g.data(), float(lr));
    ref.Step(pd, gd, decay, float(lr), 0.9f, 0.99f, 1e-8f, 0.1f);
  }
  EXPECT_EQ(opt.step_count(), 5);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(p[i], pd[i], 1e-6 * std::max(1.0, std::abs(pd[i]))) << "param " << i;
    EXPECT_NEAR(opt.m()[i], ref.m[i], 1e-6) << "m " << i;
    EXPECT_NEAR(opt.v()[i], ref.v[i], 1e-7) << "v " << i;
  }
}

TEST(AdamWTest, FirstStepMovesEachParameterByLrTimesSignOfGradient) {
  // With bias correction, m_hat = g and v_hat = g^2 on step 1: the update is lr * g/|g|.
  const std::vector<FakeTensor> tensors = {{0, 3, false}};
  AdamW opt(tensors, 3, AdamWConfig{0.9f, 0.999f, 1e-8f, 0.5f});
  std::vector<float> p = {1.0f, 2.0f, 3.0f};
  std::vector<float> g = {0.5f, -2.0f, 1e-3f};
  opt.Step(p.data(), g.data(), 0.1f);
  EXPECT_NEAR(p[0], 0.9f, 1e-6);
  EXPECT_NEAR(p[1], 2.1f, 1e-6);
  EXPECT_NEAR(p[2], 2.9f, 1e-4);
}

TEST(AdamWTest, WeightDecayOnlyOnDecayTensorsAndNotOnUncoveredGaps) {
  // Elements 0-1 decay, 2-3 do not, 4 is covered by no tensor; zero gradients isolate decay.
  const std::vector<FakeTensor> tensors = {{0, 2, true}, {2, 2, false}};
  AdamW opt(tensors, 5, AdamWConfig{0.9f, 0.99f, 1e-8f, 0.1f});
  std::vector<float> p(5, 2.0f), g(5, 0.0f);
  opt.Step(p.data(), g.data(), 0.5f);
  EXPECT_FLOAT_EQ(p[0], 2.0f - 0.5f * 0.1f * 2.0f);
  EXPECT_FLOAT_EQ(p[1], 1.9f);
  EXPECT_FLOAT_EQ(p[2], 2.0f);
  EXPECT_FLOAT_EQ(p[3], 2.0f);
  EXPECT_FLOAT_EQ(p[4], 2.0f);
}

TEST(AdamWTest, ShardedOptimizersReproduceTheFullOne) {
  // ZeRO: two shards that split a decay tensor in the middle update exactly like one.
  const std::vector<FakeTensor> tensors = {{0, 5, true}, {5, 4, false}, {9, 7, true}};
  const size_t n = 16;
  const AdamWConfig config{0.9f, 0.95f, 1e-8f, 0.2f};
  AdamW full(tensors, n, config);
  const auto ranges = DecayRangesOf(tensors);
  AdamW lo(ranges, n, config, 0, 7);
  AdamW hi(ranges, n, config, 7, n);
  std::vector<float> a(n), b(n), g(n);
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = float(InitParam(i));
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < n; ++i) g[i] = float(Grad(i, step));
    full.Step(a.data(), g.data(), 0.05f);
    lo.Step(b.data(), g.data(), 0.05f);
    hi.Step(b.data() + 7, g.data() + 7, 0.05f);
  }
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(a[i], b[i]) << i;
  for (size_t i = 7; i < n; ++i) EXPECT_EQ(full.v()[i], hi.v()[i - 7]) << i;
}

TEST(AdamWTest, RestoredStepCountContinuesBiasCorrection) {
  const std::vector<FakeTensor> tensors = {{0, 4, true}};
  const AdamWConfig config{0.9f, 0.99f, 1e-8f, 0.1f};
  AdamW a(tensors, 4, config);
  std::vector<float> pa(4), g(4);
  for (size_t i = 0; i < 4; ++i) pa[i] = float(InitParam(i));
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < 4; ++i) g[i] = float(Grad(i, step));
    a.Step(pa.data(), g.data(), 0.01f);
  }
  // A second optimizer restored from a's state (as a checkpoint would) takes the same step.
  AdamW b(tensors, 4, config);
  std::copy(a.m(), a.m() + 4, b.m());
  std::copy(a.v(), a.v() + 4, b.v());
  b.set_step_count(a.step_count());
  std::vector<float> pb = pa;
  for (size_t i = 0; i < 4; ++i) g[i] = float(Grad(i, 2));
  a.Step(pa.data(), g.data(), 0.01f);
  b.Step(pb.data(), g.data(), 0.01f);
  EXPECT_EQ(pa, pb);
}

TrainSpec Schedule(const std::string& kind) {
  TrainSpec t;
  t.steps = 2000;
  t.lr = 1e-3;
  t.min_lr = 1e-4;
  t.warmup_steps = 100;
  t.schedule = kind;
  return t;
}

TEST(LearningRateTest, WarmsUpLinearlyFromStepZero) {
  const TrainSpec t = Schedule("cosine");
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1e-3 / 100);
  EXPECT_DOUBLE_EQ(LearningRate(t, 49), 1e-3 * 50 / 100);
  EXPECT_DOUBLE_EQ(LearningRate(t, 99), 1e-3);  // last warm-up step reaches the peak
}

TEST(LearningRateTest, CosineDecaysFromPeakToFloorAtTrainSteps) {
  const TrainSpec t = Schedule("cosine");
  EXPECT_DOUBLE_EQ(LearningRate(t, 100), 1e-3);                  // warm-up end: ratio 0
  EXPECT_NEAR(LearningRate(t, 1050), 1e-4 + 0.5 * 9e-4, 1e-15);  // half way
  const double last = 1e-4 + 0.5 * (1 + std::cos(M_PI * 1899.0 / 1900.0)) * 9e-4;
  EXPECT_NEAR(LearningRate(t, 1999), last, 1e-15);
  EXPECT_GT(LearningRate(t, 1999), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 2000), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 5000), 1e-4);  // past the end: the floor
}

TEST(LearningRateTest, LinearAndConstantSchedules) {
  const TrainSpec lin = Schedule("linear");
  EXPECT_DOUBLE_EQ(LearningRate(lin, 100), 1e-3);
  EXPECT_NEAR(LearningRate(lin, 1050), 5.5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(lin, 2000), 1e-4);
  const TrainSpec flat = Schedule("constant");
  EXPECT_DOUBLE_EQ(LearningRate(flat, 0), 1e-5);
  EXPECT_DOUBLE_EQ(LearningRate(flat, 100), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(flat, 1999), 1e-3);
}

TEST(LearningRateTest, NoWarmupStartsAtPeakAndValidatesNames) {
  TrainSpec t = Schedule("cosine");
  t.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1e-3);
  EXPECT_TRUE(ValidateSchedule("linear").ok());
  EXPECT_TRUE(ValidateSchedule("wsd").ok());
  const Status bad = ValidateSchedule("step");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("cosine | linear | constant | wsd"), std::string::npos);
}

// Warm-up, then lr held until the last decay_fraction of the steps, then linear to min_lr;
// the same learning rate up to the decay whatever train.steps is.
TEST(LearningRateTest, WsdHoldsThePeakThenDecaysLinearlyOverTheLastShare) {
  TrainSpec t = Schedule("wsd");  // 2000 steps, 100 of warm-up
  t.decay_fraction = 0.2;         // decays over steps 1600 .. 2000
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1e-5);
  EXPECT_DOUBLE_EQ(LearningRate(t, 99), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 100), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1599), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1600), 1e-3);  // the decay's first step: r = 0
  EXPECT_NEAR(LearningRate(t, 1800), 5.5e-4, 1e-15);
  EXPECT_NEAR(LearningRate(t, 1999), 1e-4 + 9e-4 / 400, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(t, 2000), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 9000), 1e-4);
  // Continued to 4000 steps: the same rates through step 1599, and beyond while stable.
  TrainSpec longer = t;
  longer.steps = 4000;
  for (int64_t s : {0, 50, 99, 100, 1000, 1599}) {
    EXPECT_DOUBLE_EQ(LearningRate(longer, s), LearningRate(t, s)) << s;
  }
  EXPECT_DOUBLE_EQ(LearningRate(longer, 3199), 1e-3);
  EXPECT_NEAR(LearningRate(longer, 3600), 5.5e-4, 1e-15);
  // A decay longer than what follows the warm-up starts at its end; the shortest is a step.
  t.decay_fraction = 1.0;
  EXPECT_DOUBLE_EQ(LearningRate(t, 100), 1e-3);
  EXPECT_NEAR(LearningRate(t, 1050), 5.5e-4, 1e-15);
  t.decay_fraction = 1e-9;
  EXPECT_DOUBLE_EQ(LearningRate(t, 1998), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 1999), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRate(t, 2000), 1e-4);
}

TEST(GradClipTest, GlobalNormIsComputedInDouble) {
  // 1e8 ones: a float accumulator would stall at 2^24; the double sum is exact.
  std::vector<float> x(1 << 20, 1.0f);
  EXPECT_DOUBLE_EQ(SumSquares(x.data(), x.size()), double(1 << 20));
  std::vector<float> y = {3.0f, -4.0f};
  EXPECT_DOUBLE_EQ(GlobalNorm(y.data(), 2), 5.0);
}

TEST(GradClipTest, ClipsOnlyAboveMaxNorm) {
  std::vector<float> g = {3.0f, -4.0f};
  EXPECT_DOUBLE_EQ(ClipGradNorm(g.data(), 2, 10.0), 5.0);
  EXPECT_EQ(g, (std::vector<float>{3.0f, -4.0f}));
  EXPECT_DOUBLE_EQ(ClipGradNorm(g.data(), 2, 1.0), 5.0);
  EXPECT_NEAR(GlobalNorm(g.data(), 2), 1.0, 1e-6);
  EXPECT_NEAR(g[0], 0.6f, 1e-6);
  std::vector<float> h = {30.0f, 40.0f};
  EXPECT_DOUBLE_EQ(ClipGradNorm(h.data(), 2, 0.0), 50.0);  // disabled
  EXPECT_EQ(h[1], 40.0f);
  EXPECT_DOUBLE_EQ(ClipScale(5.0, 5.0), 1.0);
}

TEST(GradClipTest, ScaleInPlaceAveragesAccumulatedGradients) {
  std::vector<float> g = {4.0f, 8.0f, -12.0f};
  ScaleInPlace(g.data(), g.size(), 0.25f);
  EXPECT_EQ(g, (std::vector<float>{1.0f, 2.0f, -3.0f}));
}

}  // namespace
}  // namespace drover::engine
