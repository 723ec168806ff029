#include "common/yaml_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace drover::yaml_util {
namespace {

YAML::Node Scalar(const std::string& text) { return YAML::Load(text); }

TEST(YamlUtilTest, IntegersAreStrict) {
  int v = 0;
  EXPECT_TRUE(DecodeScalar(Scalar("42"), &v).ok());
  EXPECT_EQ(v, 42);
  EXPECT_TRUE(DecodeScalar(Scalar("+7"), &v).ok());
  EXPECT_EQ(v, 7);
  EXPECT_FALSE(DecodeScalar(Scalar("1.5"), &v).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("12abc"), &v).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("+-3"), &v).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("3000000000"), &v).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("[1]"), &v).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("~"), &v).ok());
  int64_t big = 0;
  EXPECT_TRUE(DecodeScalar(Scalar("3000000000"), &big).ok());
  EXPECT_EQ(big, 3000000000);
  uint64_t u = 0;
  EXPECT_TRUE(DecodeScalar(Scalar("18446744073709551615"), &u).ok());
  EXPECT_EQ(u, std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(DecodeScalar(Scalar("-1"), &u).ok());
}

TEST(YamlUtilTest, DoublesAreFinite) {
  double d = 0;
  EXPECT_TRUE(DecodeScalar(Scalar("1.0e-3"), &d).ok());
  EXPECT_EQ(d, 1.0e-3);
  EXPECT_TRUE(DecodeScalar(Scalar("3"), &d).ok());
  EXPECT_EQ(d, 3.0);
  EXPECT_FALSE(DecodeScalar(Scalar("nan"), &d).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("inf"), &d).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("1e999"), &d).ok());
  EXPECT_FALSE(DecodeScalar(Scalar("0.1x"), &d).ok());
  Status st = DecodeScalar(Scalar("fast"), &d);
  EXPECT_EQ(st.message(), "expected a finite number, got 'fast'");
}

TEST(YamlUtilTest, BoolsAndStrings) {
  bool b = false;
  EXPECT_TRUE(DecodeScalar(Scalar("True"), &b).ok());
  EXPECT_TRUE(b);
  EXPECT_TRUE(DecodeScalar(Scalar("off"), &b).ok());
  EXPECT_FALSE(b);
  EXPECT_FALSE(DecodeScalar(Scalar("2"), &b).ok());
  std::string s = "x";
  EXPECT_TRUE(DecodeScalar(Scalar("~"), &s).ok());
  EXPECT_EQ(s, "");
  EXPECT_TRUE(DecodeScalar(Scalar("\"123\""), &s).ok());
  EXPECT_EQ(s, "123");
  EXPECT_EQ(DecodeScalar(Scalar("{a: 1}"), &s).message(), "expected a string, got a mapping");
}

TEST(YamlUtilTest, FormatDoubleRoundTripsAndLooksLikeAFloat) {
  EXPECT_EQ(FormatDouble(1.0), "1.0");
  EXPECT_EQ(FormatDouble(0.001), "0.001");
  EXPECT_EQ(FormatDouble(1e-8), "1.0e-08");
  EXPECT_EQ(FormatDouble(120), "120.0");
  for (double v : {0.1, 1.0 / 3.0, 6.02e23, 2.5e-300, -7.25}) {
    double back = 0;
    ASSERT_TRUE(ParseDouble(FormatDouble(v), &back)) << FormatDouble(v);
    EXPECT_EQ(back, v);
  }
}

TEST(YamlUtilTest, ParseReportsLineAndColumn) {
  YAML::Node node;
  Status st = Parse("a: 1\nb: [1, 2\n", &node);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("invalid YAML at line"), std::string::npos) << st;
  EXPECT_TRUE(Parse("a:\n  b: 2\n", &node).ok());
  EXPECT_EQ(LineOf(node["a"]["b"]), 2);
  EXPECT_EQ(LineOf(YAML::Node(5)), 0);
}

TEST(YamlUtilTest, SuggestsCloseMatchesOnly) {
  EXPECT_EQ(EditDistance("steps", "stpes"), 2u);
  EXPECT_EQ(EditDistance("", "abc"), 3u);
  const std::vector<std::string> keys = {"steps", "seq_len", "seed", "lr", "min_lr"};
  EXPECT_EQ(ClosestMatch("stpes", keys), "steps");
  EXPECT_EQ(ClosestMatch("min_Lr", keys), "min_lr");
  EXPECT_EQ(ClosestMatch("learning_rate", keys), "");
  EXPECT_EQ(ClosestMatch("", keys), "");
  EXPECT_EQ(ClosestMatch("x", keys), "");
  EXPECT_EQ(ClosestMatch("lt", keys), "lr");
}

}  // namespace
}  // namespace drover::yaml_util
