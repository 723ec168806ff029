#include "common/token_shard.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/unit/common/fault_injection_fs.h"

namespace drover {
namespace {

class TokenShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/drover_token_shard_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes raw bytes: a header with the given fields, then `tokens` uint16 values.
  std::string WriteRaw(const std::string& name, int32_t magic, int32_t version, int32_t count,
                       size_t tokens) {
    const std::string path = dir_ + "/" + name;
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    std::vector<uint16_t> body(tokens, 7);
    out.write(reinterpret_cast<const char*>(body.data()), std::streamsize(tokens * 2));
    return path;
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      names.push_back(e.path().filename().string());
    }
    return names;
  }

  std::string dir_;
};

TEST_F(TokenShardTest, RoundTripsTokensAndWritesLlmcHeader) {
  std::vector<uint16_t> tokens = {0, 1, 2, 65535, 50256, 42};
  const std::string path = dir_ + "/a.bin";
  ASSERT_TRUE(WriteTokenShard(path, tokens).ok());
  EXPECT_EQ(std::filesystem::file_size(path), 1024u + 2 * tokens.size());
  EXPECT_EQ(Names(), std::vector<std::string>{"a.bin"});  // no temporary file left

  std::ifstream in(path, std::ios::binary);
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 6);
  EXPECT_EQ(header[3], 0);

  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, tokens);
  auto count = ReadTokenShardCount(path);
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 6u);
}

TEST_F(TokenShardTest, EmptyShardRoundTrips) {
  const std::string path = dir_ + "/empty.bin";
  ASSERT_TRUE(WriteTokenShard(path, {}).ok());
  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read->empty());
}

TEST_F(TokenShardTest, RejectsBadMagicNamingTheFile) {
  const std::string path = WriteRaw("magic.bin", 20240326, 1, 3, 3);
  auto read = ReadTokenShard(path);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find(path), std::string::npos);
  EXPECT_NE(read.status().message().find("magic 20240326"), std::string::npos);
}

TEST_F(TokenShardTest, RejectsBadVersion) {
  auto read = ReadTokenShard(WriteRaw("version.bin", 20240520, 2, 3, 3));
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("version 2"), std::string::npos);
}

TEST_F(TokenShardTest, RejectsTruncatedFileWithExpectedAndActualSize) {
  const std::string path = WriteRaw("short.bin", 20240520, 1, 10, 4);
  auto read = ReadTokenShard(path);
  ASSERT_FALSE(read.ok());
  const std::string m = read.status().message();
  EXPECT_NE(m.find(path), std::string::npos);
  EXPECT_NE(m.find("1044 bytes"), std::string::npos) << m;  // expected 1024 + 2*10
  EXPECT_NE(m.find("1032 bytes"), std::string::npos) << m;  // actual 1024 + 2*4
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
}

TEST_F(TokenShardTest, RejectsTrailingDataAndShortHeader) {
  auto trailing = ReadTokenShard(WriteRaw("long.bin", 20240520, 1, 2, 5));
  ASSERT_FALSE(trailing.ok());
  EXPECT_NE(trailing.status().message().find("trailing"), std::string::npos);

  const std::string path = dir_ + "/tiny.bin";
  std::ofstream(path) << "abc";
  auto tiny = ReadTokenShardCount(path);
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(tiny.status().message().find("shorter than"), std::string::npos);
}

// A disk that fills up mid-shard: the error names the shard, the previous shard is still
// whole and no temporary file holds the space.
TEST_F(TokenShardTest, FailedWriteKeepsTheOldShardAndLeavesNoTemporaryFile) {
  const std::string path = dir_ + "/train.bin";
  ASSERT_TRUE(WriteTokenShard(path, std::vector<uint16_t>{1, 2, 3}).ok());
  testing::FaultInjectionFileSystem fake(FileSystem::Default());
  fake.ShortWriteNth(2, ENOSPC);  // the tokens, after the header
  Status st = WriteTokenShard(path, std::vector<uint16_t>(1000, 9), &fake);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find(path), std::string::npos) << st;
  EXPECT_EQ(*ReadTokenShard(path), (std::vector<uint16_t>{1, 2, 3}));
  EXPECT_EQ(Names(), std::vector<std::string>{"train.bin"});
}

// A shard reported written is durable: its data and its name (the directory is fsynced
// after the rename) survive a crash.
TEST_F(TokenShardTest, WrittenShardSurvivesACrash) {
  const std::string path = dir_ + "/train.bin";
  testing::FaultInjectionFileSystem fake(FileSystem::Default());
  ASSERT_TRUE(WriteTokenShard(path, std::vector<uint16_t>(100, 5), &fake).ok());
  fake.DropUnsyncedData();
  auto read = ReadTokenShard(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, std::vector<uint16_t>(100, 5));
}

TEST_F(TokenShardTest, MissingFileIsNotFound) {
  auto read = ReadTokenShard(dir_ + "/nope.bin");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kNotFound);
  EXPECT_NE(read.status().message().find("nope.bin"), std::string::npos);
}

}  // namespace
}  // namespace drover
