// The node identity an agent keeps in its work dir, and the lock that keeps a second agent
// off that work dir.
#include "worker/node_identity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace drover {
namespace {

namespace fs = std::filesystem;

class NodeIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("node_identity_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(NodeIdentityTest, UidIsCreatedOnceAndKeptAcrossRestarts) {
  auto first = LoadOrCreateNodeUid(dir_.string());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 32u);
  auto again = LoadOrCreateNodeUid(dir_.string());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
  const fs::path other = dir_ / "other";
  fs::create_directories(other);
  auto elsewhere = LoadOrCreateNodeUid(other.string());
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_NE(*elsewhere, *first);
}

TEST_F(NodeIdentityTest, SecondLockOfOneWorkDirIsRefusedNamingIt) {
  ASSERT_TRUE(LockWorkDir(dir_.string()).ok());
  Status second = LockWorkDir(dir_.string());  // a new open file: flock refuses it
  EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.message(), ::testing::HasSubstr("another drover-worker runs with --work-dir"));
}

}  // namespace
}  // namespace drover
