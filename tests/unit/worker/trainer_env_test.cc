#include "worker/trainer_env.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace drover {
namespace {

// Sets the DROVER_* variables of one test and clears them afterwards.
class TrainerEnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {kEnvRank, kEnvWorldSize, kEnvFresh}) unsetenv(name);
  }
};

TEST_F(TrainerEnvTest, FreshIsOffUnlessSetToOne) {
  StatusOr<TrainerEnv> env = ReadTrainerEnv();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_FALSE(env->fresh);
  setenv(kEnvFresh, "1", 1);
  env = ReadTrainerEnv();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_TRUE(env->fresh);
  setenv(kEnvFresh, "0", 1);
  EXPECT_FALSE(ReadTrainerEnv()->fresh);
  setenv(kEnvFresh, "yes", 1);
  EXPECT_EQ(ReadTrainerEnv().status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TrainerEnvTest, RankOutsideTheWorldIsInvalid) {
  setenv(kEnvRank, "2", 1);
  setenv(kEnvWorldSize, "2", 1);
  EXPECT_EQ(ReadTrainerEnv().status().code(), StatusCode::kInvalidArgument);
  setenv(kEnvRank, "1", 1);
  StatusOr<TrainerEnv> env = ReadTrainerEnv();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->world_size, 2);
}

}  // namespace
}  // namespace drover
