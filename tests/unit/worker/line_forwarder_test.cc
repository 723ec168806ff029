#include "worker/line_forwarder.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/files.h"

namespace drover {
namespace {

// A pipe per source and one file that every source forwards to.
class LineForwarderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dest_path_ =
        ::testing::TempDir() + "/line_forwarder_" + std::to_string(getpid()) + "_" + info->name();
    dest_ = open(dest_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(dest_, 0);
  }
  void TearDown() override {
    close(dest_);
    (void)RemoveAll(dest_path_);
  }

  // A source with `prefix`; returns the write end, which the test owns.
  int AddSource(const std::string& prefix) {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    sources_.push_back({fds[0], dest_, prefix});
    return fds[1];
  }

  static void Write(int fd, const std::string& text) {
    ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }

  std::string Output() const { return ReadFileToString(dest_path_).value(); }

  std::string dest_path_;
  int dest_ = -1;
  std::vector<LineForwarder::Source> sources_;
};

TEST_F(LineForwarderTest, PrefixesWholeLinesAndEndsAnOpenLastLineAtEof) {
  const int w = AddSource("[rank 0] ");
  LineForwarder forwarder(std::move(sources_));
  Write(w, "first li");
  Write(w, "ne\n\nsecond\nno newline");
  close(w);
  EXPECT_TRUE(forwarder.Finish(5000));
  EXPECT_EQ(Output(), "[rank 0] first line\n[rank 0] \n[rank 0] second\n[rank 0] no newline\n");
}

TEST_F(LineForwarderTest, CutsALineLongerThanTheLimit) {
  const int w = AddSource("> ");
  LineForwarder forwarder(std::move(sources_));
  std::thread writer([w] {
    Write(w, std::string(LineForwarder::kMaxLineBytes + 10, 'x'));
    close(w);
  });
  EXPECT_TRUE(forwarder.Finish(5000));
  writer.join();
  EXPECT_EQ(Output(), "> " + std::string(LineForwarder::kMaxLineBytes, 'x') + "\n> " +
                          std::string(10, 'x') + "\n");
}

TEST_F(LineForwarderTest, FinishGivesUpOnASourceLeftOpenButForwardsWhatItHas) {
  const int w = AddSource("[rank 1] ");
  LineForwarder forwarder(std::move(sources_));
  Write(w, "done\npartial");
  EXPECT_FALSE(forwarder.Finish(100));  // the write end is still open
  close(w);
  EXPECT_EQ(Output(), "[rank 1] done\n[rank 1] partial\n");
}

TEST_F(LineForwarderTest, LinesOfConcurrentSourcesNeverMix) {
  constexpr int kSources = 4;
  constexpr int kLines = 2000;
  std::vector<int> writers;
  for (int s = 0; s < kSources; ++s) {
    std::string prefix = "[";  // built up, not with operator+: GCC 12's -Wrestrict misfires
    prefix += std::to_string(s) + "] ";
    writers.push_back(AddSource(prefix));
  }
  LineForwarder forwarder(std::move(sources_));
  std::vector<std::thread> threads;
  for (int s = 0; s < kSources; ++s) {
    threads.emplace_back([s, w = writers[s]] {
      // Each line in two writes, so a reader between them sees half a line.
      for (int i = 0; i < kLines; ++i) {
        Write(w, "source " + std::to_string(s) + " li");
        Write(w, "ne " + std::to_string(i) + "\n");
      }
      close(w);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(forwarder.Finish(10000));
  std::istringstream out(Output());
  std::vector<int> next(kSources, 0);
  int count = 0;
  for (std::string line; std::getline(out, line); ++count) {
    int s = -1, i = -1, s2 = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "[%d] source %d line %d", &s, &s2, &i), 3) << line;
    ASSERT_EQ(s, s2) << line;
    ASSERT_EQ(i, next[s]++) << line;  // each source's lines whole and in order
  }
  EXPECT_EQ(count, kSources * kLines);
}

}  // namespace
}  // namespace drover
