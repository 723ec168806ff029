// The emulated device must catch what it exists to catch, or the multi-rank tests that
// run on it prove nothing: host code touching device memory, kernels handed host memory.
#include "tests/unit/worker/engine/emulated_device_ops.h"

#include <gtest/gtest.h>

#include <vector>

namespace drover::engine::testing {
namespace {

TEST(EmulatedDeviceOpsTest, MemoryRoundTripsThroughTheHostAndKernelsComputeOnIt) {
  EmulatedDeviceOps ops;
  Buffer x = ops.Allocate(1000);
  Buffer y = ops.Allocate(1000);
  EXPECT_TRUE(ops.IsDeviceMemory(x.data()));
  EXPECT_TRUE(ops.IsDeviceMemory(x.data() + 999));
  std::vector<float> host(1000);
  EXPECT_FALSE(ops.IsDeviceMemory(host.data()));
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  ops.FromHost(x.data(), host.data(), host.size());
  ops.Fill(y.data(), 1.0f, y.size());
  ops.Add(y.data(), x.data(), y.size());
  EXPECT_DOUBLE_EQ(ops.SumSquares(x.data(), x.size()), 999.0 * 1000 * 1999 / 6);
  std::vector<float> back(1000);
  ops.ToHost(back.data(), y.data(), back.size());
  for (size_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], static_cast<float>(i) + 1);
}

TEST(EmulatedDeviceOpsTest, FreedMemoryIsReusedZeroFilled) {
  EmulatedDeviceOps ops;
  float* first = nullptr;
  {
    Buffer x = ops.Allocate(4096);
    first = x.data();
    ops.Fill(x.data(), 3.0f, x.size());
  }
  Buffer again = ops.Allocate(4096);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(ops.SumSquares(again.data(), again.size()), 0.0);
}

TEST(EmulatedDeviceOpsDeathTest, HostCodeReadingDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        EmulatedDeviceOps ops;
        Buffer x = ops.Allocate(16);
        volatile float v = x.data()[3];
        (void)v;
      },
      "host code touched device memory");
}

TEST(EmulatedDeviceOpsDeathTest, KernelGivenHostMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        EmulatedDeviceOps ops;
        Buffer x = ops.Allocate(16);
        std::vector<float> host(16);
        ops.Add(x.data(), host.data(), 16);
      },
      "Add: argument x is host memory");
}

TEST(EmulatedDeviceOpsDeathTest, ToHostIntoDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        EmulatedDeviceOps ops;
        Buffer x = ops.Allocate(16);
        Buffer y = ops.Allocate(16);
        ops.ToHost(y.data(), x.data(), 16);
      },
      "ToHost: argument host is device memory");
}

}  // namespace
}  // namespace drover::engine::testing
