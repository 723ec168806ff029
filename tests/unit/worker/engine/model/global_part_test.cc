#include "worker/engine/model/global_part.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace drover::engine {
namespace {

TEST(GlobalPartTest, SortsAndMergesOverlappingAndAdjacentRangesAndDropsEmptyOnes) {
  const GlobalPart p({{40, 50}, {0, 10}, {5, 12}, {12, 20}, {30, 30}, {45, 48}});
  EXPECT_EQ(p.ranges(), (std::vector<ElementRange>{{0, 20}, {40, 50}}));
  EXPECT_EQ(p.size(), 30u);
  EXPECT_EQ(p.end(), 50u);
  EXPECT_EQ(GlobalPart().end(), 0u);
}

TEST(GlobalPartTest, ValuesOfEachRangeLieBackToBack) {
  GlobalPart p({{100, 103}, {7, 9}});
  EXPECT_EQ(p.At(7, 2) + 2, p.At(100, 3)) << "range [7, 9) first, then [100, 103)";
  float* v = p.MutableAt(101, 2);
  v[0] = 1.5f;
  v[1] = 2.5f;
  EXPECT_EQ(p.At(100, 3)[1], 1.5f);
  EXPECT_EQ(p.At(102, 1)[0], 2.5f);
  EXPECT_EQ(p.At(7, 1)[0], 0.0f) << "zero until written";
  EXPECT_EQ(std::move(p).TakeValues(), (std::vector<float>{0, 0, 0, 1.5f, 2.5f}));
}

TEST(GlobalPartTest, HoldsOnlyWhatLiesInsideOneRange) {
  const GlobalPart p({{0, 10}, {20, 30}});
  EXPECT_TRUE(p.Holds(0, 10));
  EXPECT_TRUE(p.Holds(25, 30));
  EXPECT_TRUE(p.Holds(12, 12)) << "nothing is always held";
  EXPECT_FALSE(p.Holds(5, 21));
  EXPECT_FALSE(p.Holds(10, 11));
  EXPECT_FALSE(p.Holds(29, 31));
}

TEST(GlobalPartTest, ForEachHeldVisitsTheHeldPiecesOfARangeInOrder) {
  const GlobalPart p({{0, 10}, {20, 30}, {40, 45}});
  std::vector<ElementRange> seen;
  p.ForEachHeld(5, 42, [&](size_t b, size_t e) { seen.push_back({b, e}); });
  EXPECT_EQ(seen, (std::vector<ElementRange>{{5, 10}, {20, 30}, {40, 42}}));
  seen.clear();
  p.ForEachHeld(10, 20, [&](size_t b, size_t e) { seen.push_back({b, e}); });
  EXPECT_TRUE(seen.empty()) << "the gap holds nothing";
  p.ForEachHeld(44, 100, [&](size_t b, size_t e) { seen.push_back({b, e}); });
  EXPECT_EQ(seen, (std::vector<ElementRange>{{44, 45}}));
}

TEST(GlobalPartDeathTest, ReadingAnElementNotHeldAborts) {
  const GlobalPart p({{0, 10}, {20, 30}});
  EXPECT_DEATH((void)p.At(8, 4), "elements outside the part");
}

}  // namespace
}  // namespace drover::engine
