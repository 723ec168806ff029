#include "coordinator/log_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace drover::coordinator {
namespace {

class LogStoreTest : public ::testing::Test {
 protected:
  LogStoreTest()
      : root_(::testing::TempDir() + "/drover_logs_" + std::to_string(getpid())), logs_(root_) {
    std::filesystem::remove_all(root_);
  }
  std::string ReadAll(const std::string& job, int rank) {
    return logs_.Read(job, rank, 0, 1 << 20)->data;
  }
  std::string root_;
  LogStore logs_;
};

TEST_F(LogStoreTest, AppendsDeduplicateRetriedAndOverlappingChunks) {
  ASSERT_TRUE(logs_.Append("j-1", 1, 0, 0, "hello ").ok());
  ASSERT_TRUE(logs_.Append("j-1", 1, 0, 0, "hello ").ok());      // retry
  ASSERT_TRUE(logs_.Append("j-1", 1, 0, 3, "lo world\n").ok());  // overlap
  EXPECT_EQ(ReadAll("j-1", 0), "hello world\n");
  // A new attempt's agent log starts again at offset 0 and is appended after.
  ASSERT_TRUE(logs_.Append("j-1", 2, 0, 0, "again\n").ok());
  EXPECT_EQ(ReadAll("j-1", 0), "hello world\nagain\n");
  EXPECT_EQ(ReadAll("j-1", 1), "");  // another rank: nothing yet, not an error
}

TEST_F(LogStoreTest, RetriedChunkIsDroppedAfterACoordinatorRestart) {
  ASSERT_TRUE(logs_.Append("j-1", 3, 0, 0, "first\n").ok());
  // A new store on the same directory (the coordinator restarted); the agent never saw
  // the ack of "first" and sends it again, then the rest.
  LogStore restarted(root_);
  ASSERT_TRUE(restarted.Append("j-1", 3, 0, 0, "first\n").ok());
  ASSERT_TRUE(restarted.Append("j-1", 3, 0, 6, "second\n").ok());
  EXPECT_EQ(restarted.Read("j-1", 0, 0, 1 << 20)->data, "first\nsecond\n");
  // Another attempt starts from offset 0 again.
  LogStore again(root_);
  ASSERT_TRUE(again.Append("j-1", 4, 0, 0, "third\n").ok());
  EXPECT_EQ(again.Read("j-1", 0, 0, 1 << 20)->data, "first\nsecond\nthird\n");
  // A torn sidecar only costs de-duplication: the chunk is appended again, nothing lost.
  std::filesystem::resize_file(root_ + "/j-1/rank-0.log.next", 7);
  LogStore torn(root_);
  ASSERT_TRUE(torn.Append("j-1", 4, 0, 0, "third\n").ok());
  EXPECT_EQ(torn.Read("j-1", 0, 0, 1 << 20)->data, "first\nsecond\nthird\nthird\n");
}

TEST_F(LogStoreTest, ReadsByteRanges) {
  ASSERT_TRUE(logs_.Append("j-1", 1, 2, 0, "0123456789").ok());
  auto c = logs_.Read("j-1", 2, 4, 3);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data, "456");
  EXPECT_EQ(c->next_offset, 7);
  c = logs_.Read("j-1", 2, 10, 3);
  EXPECT_EQ(c->data, "");
  EXPECT_EQ(c->next_offset, 10);
}

TEST_F(LogStoreTest, RejectsPathTricks) {
  EXPECT_EQ(logs_.Append("../etc", 1, 0, 0, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(logs_.Read("a/b", 0, 0, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(logs_.Append("j", 1, -1, 0, "x").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace drover::coordinator
