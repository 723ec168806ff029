#include "worker/gpu_probe.h"

#include <gtest/gtest.h>

#include <cstdlib>
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

// A driver that lists GPUs (fake_cuda_driver.cc, as the NVIDIA driver would): each with its
// name, memory and compute capability, as the agent registers them.
TEST(GpuProbeTest, DriverListingGpusGivesTheirNamesMemoryAndComputeCapability) {
  ASSERT_EQ(setenv("DROVER_FAKE_GPUS", "NVIDIA H200,141,90;NVIDIA A100-SXM4-80GB,80,80", 1), 0);
  auto gpus = ProbeGpus(DROVER_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[0].index, 0);
  EXPECT_EQ((*gpus)[0].name, "NVIDIA H200");
  EXPECT_EQ((*gpus)[0].memory_bytes, int64_t{141} << 30);
  EXPECT_EQ((*gpus)[0].compute_capability, 90);
  EXPECT_EQ((*gpus)[1].index, 1);
  EXPECT_EQ((*gpus)[1].compute_capability, 80);
  // Their PCI bus ids, by which NVML finds them (gpu_health.h).
  EXPECT_EQ((*gpus)[0].pci_bus_id, "00000000:00:00.0");
  EXPECT_EQ((*gpus)[1].pci_bus_id, "00000000:01:00.0");
  EXPECT_TRUE(CheckComputeCapability(*gpus).ok());
  EXPECT_EQ(GpuSlotDescription(1, (*gpus)[1]),
            "cuda:1 NVIDIA A100-SXM4-80GB (80 GiB, compute 8.0)");

  // No device: the driver's own error, by name.
  ASSERT_EQ(setenv("DROVER_FAKE_GPUS", "", 1), 0);
  auto none = ProbeGpus(DROVER_FAKE_CUDA_DRIVER);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("cuInit failed: CUDA_ERROR_NO_DEVICE (100)"),
            std::string::npos)
      << none.status();
  unsetenv("DROVER_FAKE_GPUS");
}

// A GPU older than the kernels allow (a V100, 7.0) is refused by ordinal, name and capability,
// with how to leave it out; a capability the driver did not give (0) is left to the trainer.
TEST(GpuProbeTest, GpuOlderThanTheKernelsAllowIsRefusedByName) {
  ASSERT_EQ(setenv("DROVER_FAKE_GPUS", "NVIDIA H200,141,90;Tesla V100-SXM2-16GB,16,70", 1), 0);
  auto gpus = ProbeGpus(DROVER_FAKE_CUDA_DRIVER);
  unsetenv("DROVER_FAKE_GPUS");
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  const Status st = CheckComputeCapability(*gpus);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "GPU 1 (Tesla V100-SXM2-16GB) has compute capability 7.0; drover's CUDA kernels need "
            "8.0 or newer (leave it out with CUDA_VISIBLE_DEVICES, or run this node with "
            "--device cpu)");
  EXPECT_TRUE(CheckComputeCapability({GpuInfo{0, "unknown", 1 << 30, 0, ""}}).ok());
}

// The driver's CUDA version, and whether it serves this build's runtime: one of an older
// major version is refused, naming both and what to do; one of the runtime's major version or
// newer serves it (CUDA's minor version compatibility); an unknown version (0) is left to the
// trainer's own start-up.
TEST(GpuProbeTest, ADriverOfAnOlderCudaThanTheBuildsRuntimeIsRefusedNamingBoth) {
  ASSERT_EQ(setenv("DROVER_FAKE_CUDA_VERSION", "11040", 1), 0);
  EXPECT_EQ(DriverCudaVersion(DROVER_FAKE_CUDA_DRIVER), 11040);
  unsetenv("DROVER_FAKE_CUDA_VERSION");
  EXPECT_EQ(DriverCudaVersion("libdrover-no-such-cuda-driver.so.1"), 0);

  const Status old = CheckDriverServesRuntime(11040, 12080);
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(old.message(),
            "the NVIDIA driver supports CUDA 11.4 and this build's CUDA runtime is 12.8, which "
            "needs a driver of CUDA 12.0 or newer: every trainer here would fail at its start. "
            "Update the driver (nvidia-smi shows its version), or run a drover built with a CUDA "
            "toolkit the driver supports");
  EXPECT_FALSE(CheckDriverServesRuntime(12080, 13000).ok());
  EXPECT_TRUE(CheckDriverServesRuntime(12020, 12080).ok());
  EXPECT_TRUE(CheckDriverServesRuntime(13000, 12080).ok());
  EXPECT_TRUE(CheckDriverServesRuntime(0, 12080).ok());
  EXPECT_TRUE(CheckDriverServesRuntime(11040, 0).ok());
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
  // How many ranks share each one's GPU: 5 ranks on 2 GPUs are 3 on the first (ranks 0, 2,
  // 4) and 2 on the second; 2 on 3 GPUs have one each; without GPUs, 1.
  for (int rank : {0, 2, 4}) EXPECT_EQ(LocalRanksOnGpuOf(rank, 5, 2), 3) << rank;
  for (int rank : {1, 3}) EXPECT_EQ(LocalRanksOnGpuOf(rank, 5, 2), 2) << rank;
  EXPECT_EQ(LocalRanksOnGpuOf(1, 2, 3), 1);
  EXPECT_EQ(LocalRanksOnGpuOf(3, 4, 1), 4);
  EXPECT_EQ(LocalRanksOnGpuOf(0, 2, 0), 1);
}

// A GPU's dense 16-bit tensor peak by the driver's name for it: variants before their family,
// whole words only (an L4 is no L40, an H20 no H200), 0 for a GPU not known.
TEST(GpuProbeTest, DensePeakIsTheDatasheetsForTheNamedGpu) {
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA H200"), 989);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA H200 NVL"), 835);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA H100 80GB HBM3"), 989);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA H100 PCIe"), 756);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA H100 NVL"), 835);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA H20"), 148);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA A100-SXM4-80GB"), 312);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA A100-PCIE-40GB"), 312);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA L4"), 121);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA L40S"), 362);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA L40"), 181);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA A10"), 125);
  EXPECT_EQ(DenseTensorPeakTflops("NVIDIA GeForce RTX 4090"), 0);
  EXPECT_EQ(DenseTensorPeakTflops(""), 0);
}

// What a rank's MFU counts against: DROVER_PEAK_TFLOPS when set (a malformed one refused by
// name), else its GPU's datasheet peak for a CUDA job, shared by the ranks that use the GPU,
// else unknown.
TEST(GpuProbeTest, ARanksPeakIsTheVariablesElseItsShareOfItsGpusElseUnknown) {
  ASSERT_EQ(setenv("DROVER_FAKE_GPUS", "NVIDIA H100 PCIe,80,90", 1), 0);
  unsetenv(kEnvPeakTflops);
  EXPECT_EQ(*PeakTflopsOfThisRank("cuda", 1, DROVER_FAKE_CUDA_DRIVER), 756);
  EXPECT_EQ(*PeakTflopsOfThisRank("cuda", 2, DROVER_FAKE_CUDA_DRIVER), 378);
  EXPECT_EQ(*PeakTflopsOfThisRank("cpu", 1, DROVER_FAKE_CUDA_DRIVER), 0);
  EXPECT_EQ(*PeakTflopsOfThisRank("cuda", 1, "libdrover-no-such-cuda-driver.so.1"), 0);
  // The variable is the rank's own peak, as its user measured or knows it.
  ASSERT_EQ(setenv(kEnvPeakTflops, "1.5", 1), 0);
  EXPECT_EQ(*PeakTflopsOfThisRank("cpu", 1, DROVER_FAKE_CUDA_DRIVER), 1.5);
  EXPECT_EQ(*PeakTflopsOfThisRank("cuda", 2, DROVER_FAKE_CUDA_DRIVER), 1.5);
  for (const char* bad : {"fast", "0", "-3", "2x", "inf"}) {
    ASSERT_EQ(setenv(kEnvPeakTflops, bad, 1), 0);
    const Status refused = PeakTflopsOfThisRank("cpu").status();
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(refused.message(),
              std::string("DROVER_PEAK_TFLOPS='") + bad + "' is not a positive number of TFLOP/s");
  }
  unsetenv(kEnvPeakTflops);
  unsetenv("DROVER_FAKE_GPUS");
}

}  // namespace
}  // namespace drover
