#include "worker/engine/parallel/cuda_groups.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace drover::engine::parallel {
namespace {

TEST(CudaGroupsTest, AutoTakesNcclOnlyWhenEveryRankHasItsOwnGpuAndNccl) {
  const std::vector<CudaDevice> own = {{"a/0000:01:00.0", true}, {"a/0000:02:00.0", true}};
  EXPECT_TRUE(ChooseNccl("auto", own)->nccl);
  EXPECT_TRUE(ChooseNccl("nccl", own)->nccl);
  EXPECT_FALSE(ChooseNccl("gloo", own)->nccl);
  // The same bus id on two hosts is two GPUs.
  EXPECT_TRUE(ChooseNccl("auto", {{"a/0000:01:00.0", true}, {"b/0000:01:00.0", true}})->nccl);

  const std::vector<CudaDevice> shared = {{"a/0000:01:00.0", true}, {"a/0000:01:00.0", true}};
  auto fallback = ChooseNccl("auto", shared);
  ASSERT_TRUE(fallback.ok());
  EXPECT_FALSE(fallback->nccl);
  EXPECT_NE(fallback->reason.find("ranks 0 and 1 share the GPU a/0000:01:00.0"), std::string::npos)
      << fallback->reason;
  auto refused = ChooseNccl("nccl", shared);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("parallel.backend nccl: ranks 0 and 1 share"),
            std::string::npos)
      << refused.status();

  const std::vector<CudaDevice> no_nccl = {{"a/1", true}, {"a/2", false}};
  EXPECT_FALSE(ChooseNccl("auto", no_nccl)->nccl);
  auto refused_build = ChooseNccl("nccl", no_nccl);
  ASSERT_FALSE(refused_build.ok());
  EXPECT_NE(refused_build.status().message().find("rank 1's CUDA backend was built without NCCL"),
            std::string::npos)
      << refused_build.status();
}

TEST(CudaGroupsTest, EveryRankLearnsEveryRanksGpuInRankOrder) {
  InMemoryKvStore store;
  std::vector<StatusOr<std::vector<CudaDevice>>> seen(3, InternalError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      seen[r] = ExchangeCudaDevices(&store, r, 3, CudaDevice{"h/" + std::to_string(r), r != 1},
                                    std::chrono::seconds(10));
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(seen[r].ok()) << seen[r].status();
    ASSERT_EQ(seen[r]->size(), 3u);
    EXPECT_EQ((*seen[r])[2].id, "h/2");
    EXPECT_FALSE((*seen[r])[1].nccl);
    EXPECT_TRUE((*seen[r])[0].nccl);
  }
  // A rank that never publishes: the others give up at the deadline, naming it.
  InMemoryKvStore lonely;
  auto alone =
      ExchangeCudaDevices(&lonely, 0, 2, CudaDevice{"h/0", true}, std::chrono::milliseconds(50));
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().ToString().find("rank 1's GPU"), std::string::npos) << alone.status();
}

}  // namespace
}  // namespace drover::engine::parallel
