#include "coordinator/straggler.h"

#include <gtest/gtest.h>

namespace drover::coordinator {
namespace {

constexpr double kFactor = 1.2;  // the spec's default

std::vector<int> Ranks(const std::vector<Straggler>& found) {
  std::vector<int> ranks;
  for (const Straggler& s : found) ranks.push_back(s.rank);
  return ranks;
}

TEST(StragglerTest, TheRankWellAboveItsStagesOthersIsNamedWithThem) {
  const std::vector<Straggler> found =
      FindStragglers({{0, 0, 80}, {1, 0, 152}, {2, 0, 78}, {3, 0, 83}}, kFactor);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].rank, 1);
  EXPECT_EQ(found[0].busy_ms, 152);
  EXPECT_EQ(found[0].peers_busy_ms, 80);
  EXPECT_EQ(found[0].peers, 3);
  EXPECT_EQ(StragglerNotice(found[0]),
            "busy 152 ms a step, against 80 ms for the other 3 ranks of its stage (median): "
            "they wait for it at every step");
}

TEST(StragglerTest, RanksWithinAFifthOfEachOtherAreNone) {
  EXPECT_TRUE(FindStragglers({{0, 0, 100}, {1, 0, 119}, {2, 0, 100}}, kFactor).empty());
  EXPECT_EQ(Ranks(FindStragglers({{0, 0, 100}, {1, 0, 121}, {2, 0, 100}}, kFactor)),
            (std::vector<int>{1}));
}

TEST(StragglerTest, AJobsFactorSetsHowMuchSlowerIsAStraggler) {
  EXPECT_EQ(Ranks(FindStragglers({{0, 0, 100}, {1, 0, 140}}, 1.2)), (std::vector<int>{1}));
  EXPECT_TRUE(FindStragglers({{0, 0, 100}, {1, 0, 140}}, 1.5).empty());
  EXPECT_EQ(Ranks(FindStragglers({{0, 0, 100}, {1, 0, 151}}, 1.5)), (std::vector<int>{1}));
}

TEST(StragglerTest, TinyStepsNeedAFewMillisecondsMoreNotJustAShare) {
  // 6 ms against 3 ms is twice as slow, but 3 ms is jitter.
  EXPECT_TRUE(FindStragglers({{0, 0, 3}, {1, 0, 6}}, kFactor).empty());
  EXPECT_EQ(Ranks(FindStragglers({{0, 0, 3}, {1, 0, 8}}, kFactor)), (std::vector<int>{1}));
}

TEST(StragglerTest, OnlyRanksOfOneStageAreCompared) {
  // The last stage holds the LM head and is busier than the first: no straggler. Within
  // the last stage, rank 3 is.
  EXPECT_TRUE(FindStragglers({{0, 0, 50}, {1, 0, 52}, {2, 1, 90}, {3, 1, 91}}, kFactor).empty());
  const std::vector<Straggler> found =
      FindStragglers({{0, 0, 50}, {1, 0, 52}, {2, 1, 90}, {3, 1, 140}}, kFactor);
  ASSERT_EQ(Ranks(found), (std::vector<int>{3}));
  EXPECT_EQ(found[0].peers, 1);
  EXPECT_EQ(StragglerNotice(found[0]),
            "busy 140 ms a step, against 90 ms for the other rank of its stage: they wait for "
            "it at every step");
}

TEST(StragglerTest, UnknownPacesAndLoneRanksAreLeftOut) {
  // Rank 1 has reported too few steps; rank 2 is alone in its stage.
  EXPECT_TRUE(FindStragglers({{0, 0, 50}, {1, 0, 0}, {2, 1, 500}}, kFactor).empty());
}

TEST(StragglerTest, SeveralSlowRanksAreEachNamedUnlessMostOfTheStageIsSlow) {
  EXPECT_EQ(Ranks(FindStragglers({{3, 0, 100}, {0, 0, 60}, {1, 0, 100}, {2, 0, 60}}, kFactor)),
            (std::vector<int>{1, 3}));
  EXPECT_TRUE(FindStragglers({{0, 0, 100}, {1, 0, 100}, {2, 0, 100}, {3, 0, 60}}, kFactor).empty());
}

TEST(StragglerTest, DroppingAStragglerPaysWhenTheOthersTakeOnItsShareSooner) {
  // 4 ranks to 3: the job's 80 ms a step before its straggler grows by 4/3, to about 107 ms,
  // against 200 now.
  const std::optional<Shrink> s = ShrinkWithout(1, 4, {1, 2, 3, 4}, {{4, 80}}, 200);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->world_size, 3);
  EXPECT_NEAR(s->step_ms_after, 80.0 * 4 / 3, 1e-9);
  // 2 ranks to 1: 80 ms doubles, to 160, which beats 200 but not 150.
  EXPECT_EQ(ShrinkWithout(1, 2, {1, 2}, {{2, 80}}, 200)->world_size, 1);
  EXPECT_FALSE(ShrinkWithout(1, 2, {1, 2}, {{2, 80}}, 150).has_value());
}

TEST(StragglerTest, AShrinkMustPromiseATenthShorterStep) {
  // 90 ms times 4/3 is 120; 120 and a tenth is 132.
  EXPECT_TRUE(ShrinkWithout(1, 4, {3, 4}, {{4, 90}}, 133).has_value());
  EXPECT_FALSE(ShrinkWithout(1, 4, {3, 4}, {{4, 90}}, 131).has_value());
}

TEST(StragglerTest, AShrinkTakesTheLargestFeasibleSizeWithoutEveryStraggler) {
  // Two stragglers of 8: at most 6 ranks; 6 is not feasible (its dp does not divide the
  // batch, say), 4 is.
  const std::optional<Shrink> s = ShrinkWithout(2, 8, {1, 2, 4, 8}, {{8, 50}}, 400);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->world_size, 4);
  EXPECT_EQ(s->step_ms_after, 100);
  // Pipeline stages of 2: one straggler takes its whole data-parallel replica with it.
  EXPECT_EQ(ShrinkWithout(1, 8, {2, 4, 6, 8}, {{8, 50}}, 400)->world_size, 6);
  // No feasible size below the job's: nothing to shrink to.
  EXPECT_FALSE(ShrinkWithout(2, 8, {8}, {{8, 50}}, 400).has_value());
  EXPECT_FALSE(ShrinkWithout(0, 8, {1, 2, 4, 8}, {{8, 50}}, 400).has_value());
}

TEST(StragglerTest, APaceMeasuredAtTheSmallerSizeIsTakenAsItIs) {
  // The job ran at 3 ranks without stragglers at 110 ms a step (more than 80 * 4/3: the
  // reductions do not shrink with the work), and at 4 ranks at 80 ms.
  const std::optional<Shrink> s = ShrinkWithout(1, 4, {1, 2, 3, 4}, {{3, 110}, {4, 80}}, 200);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->step_ms_after, 110);
  EXPECT_EQ(s->from_size, 3);
  EXPECT_EQ(s->from_pace_ms, 110);
  // Which may be what says a shrink does not pay.
  EXPECT_FALSE(ShrinkWithout(1, 4, {1, 2, 3, 4}, {{3, 190}, {4, 80}}, 200).has_value());
}

TEST(StragglerTest, WithoutAPaceFromBeforeTheStragglerNothingIsDropped) {
  // A job whose rank was slow from its attempt's start has never run without it; a pace at
  // another size than this one or the smaller one is not scaled from.
  EXPECT_FALSE(ShrinkWithout(1, 4, {1, 2, 3, 4}, {}, 1000).has_value());
  EXPECT_FALSE(ShrinkWithout(1, 4, {1, 2, 3, 4}, {{2, 50}}, 1000).has_value());
}

}  // namespace
}  // namespace drover::coordinator
