// cli/progress.h: the progress line of `drover status`.
#include "cli/progress.h"

#include <gtest/gtest.h>

namespace drover::cli {
namespace {

TEST(FormatProgressTest, StepsTokensAndTheTimeLeftAtTheLastStepTime) {
  // 660 steps left at 250 ms each: 165 s.
  EXPECT_EQ(FormatProgress(340, 1000, 250.0, 12345.4),
            "step 340/1000 (34.0%) | 12345 tok/s | ETA 2m45s");
  EXPECT_EQ(FormatProgress(1000, 1000, 250.0, 0), "step 1000/1000 (100.0%) | done");
  // Not running (no step time) or no spec: the parts that are known.
  EXPECT_EQ(FormatProgress(0, 500, 0, 0), "step 0/500 (0.0%)");
  EXPECT_EQ(FormatProgress(7, 0, 100.0, 0), "step 7");
  // Where rank 0 knows its device's peak, its MFU.
  EXPECT_EQ(FormatProgress(340, 1000, 250.0, 12345.4, 0, 0.4812),
            "step 340/1000 (34.0%) | 12345 tok/s | MFU 48.1% | ETA 2m45s");
}

TEST(FormatProgressTest, StepsBelowTheFurthestReachedAreMarkedRecomputed) {
  EXPECT_EQ(FormatProgress(140, 300, 0, 0, 160), "step 140/300 (46.7%) (recomputed after restart)");
  EXPECT_EQ(FormatProgress(160, 300, 0, 0, 160), "step 160/300 (53.3%)");
  EXPECT_EQ(FormatProgress(170, 300, 0, 0, 160), "step 170/300 (56.7%)");
  EXPECT_EQ(RecomputedNote(41, 55), " (recomputed after restart)");
  EXPECT_EQ(RecomputedNote(55, 55), "");
  EXPECT_EQ(RecomputedNote(3, 0), "");  // a record from before furthest_step existed
}

}  // namespace
}  // namespace drover::cli
