#include "common/duration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace drover {
namespace {

using ::testing::HasSubstr;

TEST(DurationTest, ParsesEachUnitAndABareZero) {
  EXPECT_EQ(*ParseDurationMs("250ms", "x"), 250);
  EXPECT_EQ(*ParseDurationMs("90s", "x"), 90'000);
  EXPECT_EQ(*ParseDurationMs("30m", "x"), 1'800'000);
  EXPECT_EQ(*ParseDurationMs("12h", "x"), 43'200'000);
  EXPECT_EQ(*ParseDurationMs("7d", "x"), 604'800'000);
  EXPECT_EQ(*ParseDurationMs("0", "x"), 0);
  EXPECT_EQ(*ParseDurationMs("0d", "x"), 0);
}

TEST(DurationTest, RefusesWhatItCannotReadNamingTheFlagAndTheValue) {
  for (const char* bad : {"", "d", "7", "7w", "-1d", "1h30m", "7 d", "99999999999999999999d"}) {
    auto r = ParseDurationMs(bad, "--job-retention");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("--job-retention: '" + std::string(bad) + "'"));
  }
  EXPECT_THAT(ParseDurationMs("9999999999999999d", "x").status().message(),
              HasSubstr("out of range"));
  EXPECT_THAT(ParseDurationMs("7w", "x").status().message(), HasSubstr("unknown unit 'w'"));
}

TEST(FormatDurationMsTest, SecondsMinutesHours) {
  EXPECT_EQ(FormatDurationMs(4200), "4.2s");
  EXPECT_EQ(FormatDurationMs(312000), "5m12s");
  EXPECT_EQ(FormatDurationMs(3 * 3600000 + 7 * 60000 + 5000), "3h07m");
  EXPECT_EQ(FormatDurationMs(-5), "0.0s");
}

TEST(FormatTimeLimitTest, MinutesAsADurationAndZeroAsNone) {
  EXPECT_EQ(FormatTimeLimit(720), "12h00m");
  EXPECT_EQ(FormatTimeLimit(0.1), "6.0s");
  EXPECT_EQ(FormatTimeLimit(20.0 / 60.0), "20.0s");
  EXPECT_EQ(FormatTimeLimit(0), "none");
}

}  // namespace
}  // namespace drover
