#include "coordinator/tokens.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace drover::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kAdminToken[] = "0123456789abcdef0123";
constexpr char kReaderToken[] = "fedcba9876543210fedc";

TEST(TokenFileTest, ParsesRolesNamesCommentsAndBlankLines) {
  auto entries =
      ParseTokenFile(std::string("# cluster tokens\n\n") + kAdminToken + " admin alice\n  " +
                         kReaderToken + "\tread-only   dashboard \r\n",
                     "tokens.txt");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].token, kAdminToken);
  EXPECT_EQ((*entries)[0].role, Role::kAdmin);
  EXPECT_EQ((*entries)[0].name, "alice");
  EXPECT_EQ((*entries)[1].token, kReaderToken);
  EXPECT_EQ((*entries)[1].role, Role::kReadOnly);
  EXPECT_EQ((*entries)[1].name, "dashboard");
}

TEST(TokenFileTest, RejectsAWrongFieldCountNamingFileAndLine) {
  auto entries = ParseTokenFile(
      std::string(kAdminToken) + " admin alice\n" + kReaderToken + " read-only\n", "tokens.txt");
  ASSERT_FALSE(entries.ok());
  EXPECT_EQ(entries.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(entries.status().message(), HasSubstr("tokens.txt:2:"));
  EXPECT_THAT(entries.status().message(), HasSubstr("TOKEN ROLE NAME"));
}

TEST(TokenFileTest, RejectsAnUnknownRoleSayingWhichAreValid) {
  auto entries = ParseTokenFile(std::string(kAdminToken) + " root alice\n", "t");
  ASSERT_FALSE(entries.ok());
  EXPECT_THAT(entries.status().message(), HasSubstr("role 'root'"));
  EXPECT_THAT(entries.status().message(), HasSubstr("admin or read-only"));
}

TEST(TokenFileTest, RejectsAShortTokenWithoutEchoingIt) {
  auto entries = ParseTokenFile("hunter2 admin alice\n", "t");
  ASSERT_FALSE(entries.ok());
  EXPECT_THAT(entries.status().message(), HasSubstr("at least 16"));
  EXPECT_THAT(entries.status().message(), HasSubstr("'alice'"));
  EXPECT_THAT(entries.status().message(), ::testing::Not(HasSubstr("hunter2")));
}

TEST(TokenFileTest, RejectsATokenWithANonAsciiCharacter) {
  auto entries = ParseTokenFile("0123456789abcdef\xc3\xa9 admin alice\n", "t");
  ASSERT_FALSE(entries.ok());
  EXPECT_THAT(entries.status().message(), HasSubstr("not printable ASCII"));
}

TEST(TokenFileTest, RejectsATokenListedTwice) {
  auto entries = ParseTokenFile(
      std::string(kAdminToken) + " read-only bob\n" + kAdminToken + " admin alice\n", "t");
  ASSERT_FALSE(entries.ok());
  EXPECT_THAT(entries.status().message(), HasSubstr("t:2:"));
  EXPECT_THAT(entries.status().message(), HasSubstr("listed before (as 'bob')"));
}

TEST(TokenFileTest, RejectsAFileWithoutTokens) {
  auto entries = ParseTokenFile("# nothing yet\n\n", "t");
  ASSERT_FALSE(entries.ok());
  EXPECT_THAT(entries.status().message(), HasSubstr("holds no token"));
}

TEST(TokenFileTest, LoadNamesTheFlagWhenTheFileIsMissing) {
  auto entries = LoadTokenFile("/nonexistent/drover-tokens");
  ASSERT_FALSE(entries.ok());
  EXPECT_EQ(entries.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(entries.status().message(), HasSubstr("--tokens '/nonexistent/drover-tokens'"));
}

TEST(FindTokenTest, FindsOnlyTheExactToken) {
  std::vector<TokenEntry> entries = {{kAdminToken, Role::kAdmin, "alice"},
                                     {kReaderToken, Role::kReadOnly, "bob"}};
  ASSERT_NE(FindToken(entries, kReaderToken), nullptr);
  EXPECT_EQ(FindToken(entries, kReaderToken)->name, "bob");
  EXPECT_EQ(FindToken(entries, std::string(kAdminToken).substr(0, 19)), nullptr);  // a prefix
  EXPECT_EQ(FindToken(entries, std::string(kAdminToken) + "4"), nullptr);          // longer
  EXPECT_EQ(FindToken(entries, ""), nullptr);
}

TEST(ConstantTimeEqualsTest, ComparesContentAndLength) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  // A trailing NUL is a difference, not padding.
  EXPECT_FALSE(ConstantTimeEquals(std::string_view("ab\0", 3), "ab"));
}

}  // namespace
}  // namespace drover::coordinator
