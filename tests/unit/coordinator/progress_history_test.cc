#include "coordinator/progress_history.h"

#include <gtest/gtest.h>

namespace drover::coordinator {
namespace {

v1::TrainerProgress Step(int64_t step, double loss = 1.0) {
  v1::TrainerProgress p;
  p.set_step(step);
  p.set_loss(loss);
  p.set_lr(1e-3);
  p.set_tokens_per_s(500);
  return p;
}

TEST(DecimatedTest, KeepsEvenlySpacedValuesWithinCapacityAcrossTheWholeRun) {
  Decimated<int> d(10);
  for (int i = 0; i < 1000; ++i) d.Offer(i);
  const std::vector<int>& kept = d.kept();
  ASSERT_LE(kept.size(), 10u);
  ASSERT_GE(kept.size(), 5u);  // a compaction halves it, never more
  EXPECT_EQ(kept.front(), 0);
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i], static_cast<int>(i) * d.stride()) << "at " << i;
  }
  // It still spans the run: the last kept value is within one stride of the end.
  EXPECT_GT(kept.back() + d.stride(), 1000 - d.stride());
  EXPECT_EQ(d.offered(), 1000);
}

TEST(DecimatedTest, KeepsEverythingUntilFull) {
  Decimated<int> d(10);
  for (int i = 0; i < 9; ++i) d.Offer(i);
  EXPECT_EQ(d.kept().size(), 9u);
  EXPECT_EQ(d.stride(), 1);
  d.Offer(9);  // full: every other one goes
  EXPECT_EQ(d.kept(), (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_EQ(d.stride(), 2);
  d.Offer(10);
  d.Offer(11);  // odd offers are skipped at stride 2
  EXPECT_EQ(d.kept().back(), 10);
}

TEST(ProgressHistoryTest, RepeatedHeartbeatOfOneStepIsOnePoint) {
  ProgressHistory h;
  h.Record("j", 1, Step(5), 100);
  h.Record("j", 1, Step(5), 200);
  h.Record("j", 1, Step(6), 300);
  auto s = h.Get("j");
  ASSERT_EQ(s.points.size(), 2u);
  EXPECT_EQ(s.points[0].step, 5);
  EXPECT_EQ(s.points[0].time_ms, 100);
  EXPECT_EQ(s.points[1].step, 6);
  EXPECT_EQ(s.reports, 2);
}

// A point keeps what the dashboard shows of its report: loss, lr, tokens / s and MFU (0 where
// the trainer does not know its device's peak).
TEST(ProgressHistoryTest, APointKeepsItsReportsNumbersAndMfu) {
  ProgressHistory h;
  v1::TrainerProgress p = Step(3, 2.5);
  p.set_mfu(0.42);
  h.Record("j", 1, p, 100);
  h.Record("j", 1, Step(4), 200);
  auto s = h.Get("j");
  ASSERT_EQ(s.points.size(), 2u);
  EXPECT_EQ(s.points[0].loss, 2.5);
  EXPECT_EQ(s.points[0].lr, 1e-3);
  EXPECT_EQ(s.points[0].tokens_per_s, 500);
  EXPECT_EQ(s.points[0].mfu, 0.42);
  EXPECT_EQ(s.points[1].mfu, 0);
}

TEST(ProgressHistoryTest, StepZeroIsNoPoint) {
  ProgressHistory h;
  h.Record("j", 1, Step(0), 100);
  EXPECT_TRUE(h.Get("j").points.empty());
}

TEST(ProgressHistoryTest, ResumedAttemptRepeatsStepsAsItsOwnPoints) {
  ProgressHistory h;
  h.Record("j", 1, Step(10), 100);
  h.Record("j", 2, Step(10), 200);  // resumed from a checkpoint at step 9
  auto s = h.Get("j");
  ASSERT_EQ(s.points.size(), 2u);
  EXPECT_EQ(s.points[0].attempt, 1);
  EXPECT_EQ(s.points[1].attempt, 2);
}

TEST(ProgressHistoryTest, DecimatedSeriesStillEndsAtTheNewestReport) {
  ProgressHistory h(/*capacity=*/8);
  for (int step = 1; step <= 101; ++step) h.Record("j", 1, Step(step, 1.0 / step), step * 10);
  auto s = h.Get("j");
  ASSERT_LE(s.points.size(), 9u);  // capacity, plus the newest report
  EXPECT_GT(s.stride, 1);
  EXPECT_EQ(s.points.front().step, 1);
  EXPECT_EQ(s.points.back().step, 101);
  EXPECT_DOUBLE_EQ(s.points.back().loss, 1.0 / 101);
  EXPECT_EQ(s.reports, 101);
  for (size_t i = 1; i < s.points.size(); ++i) EXPECT_LT(s.points[i - 1].step, s.points[i].step);
}

TEST(ProgressHistoryTest, ValidationLossIsOnePointPerEvaluatedStep) {
  ProgressHistory h;
  v1::TrainerProgress p = Step(10);
  p.set_val_step(10);
  p.set_val_loss(2.5);
  h.Record("j", 1, p, 100);
  p.set_step(11);  // the sticky value rides along with later steps
  h.Record("j", 1, p, 200);
  p.set_step(20);
  p.set_val_step(20);
  p.set_val_loss(2.25);
  h.Record("j", 1, p, 300);
  auto s = h.Get("j");
  ASSERT_EQ(s.evals.size(), 2u);
  EXPECT_EQ(s.evals[0].step, 10);
  EXPECT_EQ(s.evals[0].val_loss, 2.5);
  EXPECT_EQ(s.evals[1].step, 20);
  EXPECT_EQ(s.evals[1].val_loss, 2.25);
  EXPECT_FALSE(s.evals[1].hellaswag.has_value());
  EXPECT_EQ(s.points.size(), 3u);
}

// A job with data.hellaswag reports its accuracy with the validation loss at each evaluation
// step (one point with both), and one without data.val the accuracy alone.
TEST(ProgressHistoryTest, HellaSwagIsOnTheEvaluationStepsPointWithTheValidationLoss) {
  ProgressHistory h;
  v1::TrainerProgress p = Step(10);
  p.set_val_step(10);
  p.set_val_loss(2.5);
  p.set_hellaswag_step(10);
  p.set_hellaswag(0.26);
  h.Record("j", 1, p, 100);
  p.set_step(11);
  h.Record("j", 1, p, 200);
  v1::TrainerProgress q = Step(20);
  q.set_hellaswag_step(20);
  q.set_hellaswag(0.31);
  h.Record("k", 1, q, 300);
  auto s = h.Get("j");
  ASSERT_EQ(s.evals.size(), 1u);
  EXPECT_EQ(s.evals[0].val_loss, 2.5);
  EXPECT_EQ(s.evals[0].hellaswag, 0.26);
  auto t = h.Get("k");
  ASSERT_EQ(t.evals.size(), 1u);
  EXPECT_EQ(t.evals[0].step, 20);
  EXPECT_FALSE(t.evals[0].val_loss.has_value());
  EXPECT_EQ(t.evals[0].hellaswag, 0.31);
}

TEST(ProgressHistoryTest, JobUpdatedLongestAgoIsForgottenPastMaxJobs) {
  ProgressHistory h(/*capacity=*/100, /*max_jobs=*/2);
  h.Record("a", 1, Step(1), 1);
  h.Record("b", 1, Step(1), 2);
  h.Record("a", 1, Step(2), 3);  // a is now the most recent
  h.Record("c", 1, Step(1), 4);  // evicts b
  EXPECT_EQ(h.Get("a").points.size(), 2u);
  EXPECT_TRUE(h.Get("b").points.empty());
  EXPECT_EQ(h.Get("c").points.size(), 1u);
}

TEST(ProgressHistoryTest, ForgetDropsTheJob) {
  ProgressHistory h;
  h.Record("a", 1, Step(1), 1);
  h.Forget("a");
  h.Forget("never-seen");
  EXPECT_TRUE(h.Get("a").points.empty());
}

}  // namespace
}  // namespace drover::coordinator
