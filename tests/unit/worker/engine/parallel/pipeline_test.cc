// Pipeline schedules: the action order of every stage, and that the stages of a schedule
// can run against each other without deadlock and within their activation budget.
#include "worker/engine/parallel/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <vector>

namespace drover::engine::parallel {
namespace {

std::string Render(const std::vector<PipeAction>& actions) {
  std::string s;
  for (const PipeAction& a : actions) {
    if (!s.empty()) s += " ";
    s += a.kind == PipeAction::kForward ? 'F' : 'B';
    s += std::to_string(a.micro_batch);
  }
  return s;
}

TEST(PipelineScheduleTest, GPipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::kGPipe, 2, 0, 4)), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(MaxInFlight(PipelineSchedule::kGPipe, 2, 0, 4), 4);
}

TEST(PipelineScheduleTest, OneFOneBWarmsUpByTheStagesBehind) {
  // Stage 0 of 4: 3 warm-up forwards, then alternate, then drain.
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 4, 0, 6)),
            "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  // The last stage has no warm-up: a backward follows every forward.
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 4, 3, 6)),
            "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(MaxInFlight(PipelineSchedule::k1F1B, 4, 0, 6), 4);
  EXPECT_EQ(MaxInFlight(PipelineSchedule::k1F1B, 4, 3, 6), 1);
  // Fewer micro-batches than stages: warm-up is capped by them.
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(MaxInFlight(PipelineSchedule::k1F1B, 4, 0, 2), 2);
}

TEST(PipelineScheduleTest, OneStageIsGradientAccumulation) {
  EXPECT_EQ(Render(StageSchedule(PipelineSchedule::k1F1B, 1, 0, 3)), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(MaxInFlight(PipelineSchedule::k1F1B, 1, 0, 3), 1);
}

// Simulates p stages with blocking receives and buffered sends: a forward needs the
// previous stage's forward of that micro-batch, a backward the next stage's backward.
// Every stage must finish (no deadlock), and the activation sets a stage holds (forwards
// done, backwards not yet) must never exceed MaxInFlight, where micro-batch i's set
// (i % MaxInFlight) must be free when its forward starts.
void ExpectRunsToCompletion(PipelineSchedule schedule, int p, int m) {
  std::vector<std::vector<PipeAction>> plans(p);
  for (int s = 0; s < p; ++s) plans[s] = StageSchedule(schedule, p, s, m);
  std::vector<size_t> next(p, 0);
  std::vector<std::vector<bool>> fwd_done(p, std::vector<bool>(m)), bwd_done = fwd_done;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (next[s] == plans[s].size()) continue;
      const PipeAction a = plans[s][next[s]];
      const bool ready =
          a.kind == PipeAction::kForward
              ? (s == 0 || fwd_done[s - 1][a.micro_batch])
              : (s == p - 1 ? fwd_done[s][a.micro_batch] : bwd_done[s + 1][a.micro_batch]);
      if (!ready) continue;
      if (a.kind == PipeAction::kForward) {
        const int sets = MaxInFlight(schedule, p, s, m);
        int held = 0;
        for (int i = 0; i < m; ++i) held += fwd_done[s][i] && !bwd_done[s][i];
        ASSERT_LT(held, sets) << "stage " << s << " F" << a.micro_batch;
        for (int i = a.micro_batch % sets; i < a.micro_batch; i += sets) {
          ASSERT_TRUE(bwd_done[s][i]) << "stage " << s << " reuses the set of micro-batch " << i;
        }
        fwd_done[s][a.micro_batch] = true;
      } else {
        bwd_done[s][a.micro_batch] = true;
      }
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s) EXPECT_EQ(next[s], plans[s].size()) << "stage " << s << " stuck";
}

TEST(PipelineScheduleTest, EveryScheduleCompletesWithinItsActivationSets) {
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
        ExpectRunsToCompletion(schedule, p, m);
      }
    }
  }
}

TEST(PipelineScheduleTest, ParsesTheSpecNames) {
  EXPECT_EQ(*ParsePipelineSchedule("gpipe"), PipelineSchedule::kGPipe);
  EXPECT_EQ(*ParsePipelineSchedule("1f1b"), PipelineSchedule::k1F1B);
  EXPECT_EQ(ParsePipelineSchedule("zb").status().code(), StatusCode::kInvalidArgument);
}

// GPT-2 124M at T = 64: the head is about 5.4 layers of work, so pp2 balances at 9 + 3 (the
// split that measured fastest, tests/bench/README.md); a small vocabulary keeps the even
// split; four stages give the last one the fewest layers; one stage takes them all.
TEST(BalancedStageLayersTest, TheLastStageTakesFewerLayersForTheHead) {
  EXPECT_EQ(BalancedStageLayers(12, 768, 50257, 64, 2), (std::vector<int>{9, 3}));
  EXPECT_EQ(BalancedStageLayers(12, 768, 256, 64, 2), (std::vector<int>{6, 6}));
  EXPECT_EQ(BalancedStageLayers(24, 1024, 50257, 1024, 4), (std::vector<int>{7, 7, 7, 3}));
  EXPECT_EQ(BalancedStageLayers(4, 64, 50257, 64, 4), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(BalancedStageLayers(12, 768, 50257, 64, 1), (std::vector<int>{12}));
}

}  // namespace
}  // namespace drover::engine::parallel
