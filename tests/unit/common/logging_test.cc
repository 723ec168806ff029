#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cctype>
#include <string>

#include "common/files.h"

namespace drover {
namespace {

TEST(LoggingTest, ParsesLevels) {
  EXPECT_EQ(*ParseLogLevel("debug"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("warning"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("off"), spdlog::level::off);
  StatusOr<spdlog::level::level_enum> bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'loud'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("debug"), std::string::npos);
}

TEST(LoggingTest, WritesTimeLevelProgramAndMessageToTheFile) {
  const std::string dir = ::testing::TempDir() + "/logging_test_" + std::to_string(::getpid());
  const std::string file = dir + "/sub/prog.log";
  ASSERT_TRUE(InitLogging("drover-test", "info", file).ok());
  spdlog::debug("hidden below the level");
  spdlog::warn("disk {} is {}% full", "/data", 97);
  StatusOr<std::string> text = ReadFileToString(file);  // flushed per message
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->find("hidden"), std::string::npos);
  // "2026-11-29T23:41:07.123Z W drover-test: ..." (UTC, millisecond precision).
  const std::string kTail = "Z W drover-test: disk /data is 97% full\n";
  const std::string shape = "dddd-dd-ddTdd:dd:dd.ddd";
  ASSERT_EQ(text->size(), shape.size() + kTail.size()) << *text;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 'd') {
      EXPECT_TRUE(std::isdigit(static_cast<unsigned char>((*text)[i]))) << *text;
    } else {
      EXPECT_EQ((*text)[i], shape[i]) << *text;
    }
  }
  EXPECT_EQ(text->substr(shape.size()), kTail);
  ASSERT_TRUE(InitLogging("drover-test", "info").ok());  // detach from the file
  EXPECT_TRUE(RemoveAll(dir).ok());
}

TEST(LoggingTest, RejectsABadLevel) {
  Status st = InitLogging("drover-test", "verbose");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace drover
