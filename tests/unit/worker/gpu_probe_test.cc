#include "worker/gpu_probe.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace drover {
namespace {

TEST(GpuProbeTest, NodeWithoutADriverIsToldSoByName) {
  auto gpus = ProbeGpus("libdrover-no-such-cuda-driver.so.1");
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(gpus.status().message().find("no NVIDIA driver on this node: "
                                         "libdrover-no-such-cuda-driver.so.1 cannot be loaded"),
            std::string::npos)
      << gpus.status();
}

// The toolkit's stub driver (what a build machine without a GPU has) loads, and refuses to
// initialise: the message names the driver's error.
TEST(GpuProbeTest, StubDriverRefusalIsReportedWithTheDriversError) {
  const std::string stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!std::filesystem::exists(stub)) GTEST_SKIP() << "no CUDA toolkit stub at " << stub;
  auto gpus = ProbeGpus(stub);
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(gpus.status().message().find("CUDA driver: cuInit failed: CUDA_ERROR_"),
            std::string::npos)
      << gpus.status();
}

TEST(GpuProbeTest, EachSlotSeesItsOwnGpu) {
  EXPECT_EQ(VisibleDeviceForSlot(0, ""), "0");
  EXPECT_EQ(VisibleDeviceForSlot(3, ""), "3");
  // The agent itself was given a subset: slots map onto it, in order.
  EXPECT_EQ(VisibleDeviceForSlot(0, "4,5,7"), "4");
  EXPECT_EQ(VisibleDeviceForSlot(2, "4,5,7"), "7");
  EXPECT_EQ(VisibleDeviceForSlot(1, "GPU-1a2b,GPU-3c4d"), "GPU-3c4d");
}

TEST(GpuProbeTest, LocalRanksTakeAGpuEachThenShareRoundRobin) {
  const std::vector<std::string> gpus = {"4", "5"};
  EXPECT_EQ(VisibleDeviceForLocalRank(0, gpus), "4");
  EXPECT_EQ(VisibleDeviceForLocalRank(1, gpus), "5");
  EXPECT_EQ(VisibleDeviceForLocalRank(2, gpus), "4");  // more ranks than GPUs: shared
  EXPECT_EQ(VisibleDeviceForLocalRank(0, {}), "");
}

}  // namespace
}  // namespace drover
