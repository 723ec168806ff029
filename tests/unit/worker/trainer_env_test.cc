#include "worker/trainer_env.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace drover {
namespace {

// Sets the DROVER_* variables of one test and clears them afterwards.
class TrainerEnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {kEnvRank, kEnvWorldSize, kEnvFresh, kEnvRanksOnGpu}) unsetenv(name);
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

// The ranks sharing this rank's GPU (drover train --nproc past the GPUs): 1 unless set, and
// at least 1.
TEST_F(TrainerEnvTest, RanksOnTheGpuAreOneUnlessSetAndAtLeastOne) {
  EXPECT_EQ(ReadTrainerEnv()->ranks_on_gpu, 1);
  setenv(kEnvRanksOnGpu, "3", 1);
  EXPECT_EQ(ReadTrainerEnv()->ranks_on_gpu, 3);
  setenv(kEnvRanksOnGpu, "0", 1);
  const Status refused = ReadTrainerEnv().status();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "DROVER_RANKS_ON_GPU=0 must be at least 1");
}

}  // namespace
}  // namespace drover
