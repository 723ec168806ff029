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

}  // namespace
}  // namespace drover::coordinator
