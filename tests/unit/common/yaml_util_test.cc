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

TEST(YamlUtilTest, IntegersTooLargeAreOutOfRangeWithTheAllowedRange) {
  int64_t v = 0;
  Status st = DecodeScalar(Scalar("12345678901234567890123"), &v);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "'12345678901234567890123' is out of range for this field: allowed "
            "-9223372036854775808 to 9223372036854775807");
  EXPECT_NE(DecodeScalar(Scalar("-12345678901234567890123"), &v).message().find("out of range"),
            std::string::npos);
  int i = 0;
  EXPECT_EQ(DecodeScalar(Scalar("3000000000"), &i).message(),
            "'3000000000' is out of range for this field: allowed -2147483648 to 2147483647");
  EXPECT_EQ(DecodeScalar(Scalar("12345678901234567890123"), &i).message(),
            "'12345678901234567890123' is out of range for this field: allowed -2147483648 to "
            "2147483647");
  uint64_t u = 0;
  EXPECT_EQ(DecodeScalar(Scalar("18446744073709551616"), &u).message(),
            "'18446744073709551616' is out of range for this field: allowed 0 to "
            "18446744073709551615");
  // Not a number at all is still said so.
  EXPECT_EQ(DecodeScalar(Scalar("12a"), &v).message(), "expected an integer, got '12a'");
}

// Input on which yaml-cpp 0.7's own LoadAll never returns (it allocates until the process
// is killed): a lone comma, and the like. Parse gives an answer, whatever it is, and the
// job spec reader then says what is wrong with it.
TEST(YamlUtilTest, ParseReturnsOnInputThatLoopsYamlCppsLoadAll) {
  for (const char* text : {",", "\n,\n", "a: 1\n,\n", "- !+(.,.)", ", ,"}) {
    YAML::Node node;
    const Status st = Parse(text, &node);
    EXPECT_TRUE(st.ok() || st.code() == StatusCode::kInvalidArgument) << text << ": " << st;
  }
}

TEST(YamlUtilTest, ParseRefusesASecondDocumentNamingItsLine) {
  YAML::Node node;
  Status st = Parse("name: a\n---\nname: b\n", &node);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("2 YAML documents"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("line 3"), std::string::npos) << st.message();
  // One document, with or without its markers, is fine; so is nothing at all.
  EXPECT_TRUE(Parse("---\nname: a\n...\n", &node).ok());
  EXPECT_TRUE(Parse("", &node).ok());
  EXPECT_TRUE(node.IsNull());
}

TEST(YamlUtilTest, ParseRefusesUnknownTagsNamingTagAndLine) {
  YAML::Node node;
  Status st = Parse("a: 1\nb: !!python/object:os.system echo\n", &node);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("unknown YAML tag 'tag:yaml.org,2002:python/object:os.system'"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("line 2"), std::string::npos) << st.message();
  st = Parse("a:\n  - x\n  - !foo y\n", &node);
  EXPECT_NE(st.message().find("unknown YAML tag '!foo' at line 3"), std::string::npos)
      << st.message();
  st = Parse("!custom {a: 1}\n", &node);
  EXPECT_NE(st.message().find("'!custom'"), std::string::npos) << st.message();
  // Standard tags and quoting are plain YAML.
  EXPECT_TRUE(Parse("a: !!str 12\nb: !!int 3\nc: \"q\"\nd: !!map {e: !!seq [1]}\n", &node).ok());
  EXPECT_EQ(node["a"].Scalar(), "12");
}

TEST(YamlUtilTest, ParseRefusesAliasesThatExpandBeyondAMillionValues) {
  // Each level names the previous one ten times: 10^8 values from eight short lines.
  std::string text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 7; ++i) {
    const std::string n = std::to_string(i);
    const std::string prev = std::string("*a") + std::to_string(i - 1);
    text += std::string("a") + n + ": &a" + n + " [";
    for (int k = 0; k < 10; ++k) {
      if (k > 0) text += ", ";
      text += prev;
    }
    text += "]\n";
  }
  YAML::Node node;
  Status st = Parse(text, &node);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("more than 1000000 values"), std::string::npos) << st.message();
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
