#include "common/median.h"

#include <gtest/gtest.h>

namespace drover {
namespace {

TEST(MedianTest, IsTheMiddleValueOrTheMeanOfTheTwoMiddleOnes) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({7}), 7);
  EXPECT_EQ(Median({9, 1, 5}), 5);
  EXPECT_EQ(Median({40, 400, 44, 42}), 43);
  EXPECT_EQ(Median({3, 1, 2, 100, 4, 5}), 3.5);
}

}  // namespace
}  // namespace drover
