#include "worker/gpu_health.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace drover {
namespace {

// Each state NVML reports that makes a GPU unfit, with what mends it; a healthy reading,
// "".
TEST(GpuHealthTest, EachFaultNvmlReportsNamesWhatMendsIt) {
  EXPECT_EQ(GpuFault({}), "");
  EXPECT_EQ(GpuFault({.lost = true}),
            "it has fallen off the bus (NVML: GPU is lost): the node needs a GPU reset or a "
            "reboot");
  EXPECT_EQ(GpuFault({.uncorrected_errors = 1}),
            "1 uncorrectable ECC error since its last reset (NVML): reset the GPU (nvidia-smi -r)");
  EXPECT_EQ(GpuFault({.uncorrected_errors = 3, .row_remap_pending = true}),
            "3 uncorrectable ECC errors since its last reset (NVML), and a row remap of its "
            "memory waits for a reset: reset the GPU (nvidia-smi -r)");
  EXPECT_EQ(GpuFault({.row_remap_pending = true}),
            "a row remap of its memory waits for a reset (NVML): reset the GPU (nvidia-smi -r)");
  EXPECT_EQ(GpuFault({.uncorrected_errors = 2, .row_remap_failed = true}),
            "a row of its memory could not be remapped (NVML): the GPU needs service");
  EXPECT_EQ(GpuFault({.nvlinks_down = {3}}),
            "NVLink 3 is down (it was up when the agent began checking; NVML): reset the GPU "
            "(nvidia-smi -r), or have its NVLink serviced");
  EXPECT_EQ(GpuFault({.nvlinks_down = {0, 17}}),
            "NVLinks 0, 17 are down (they were up when the agent began checking; NVML): reset "
            "the GPU (nvidia-smi -r), or have its NVLink serviced");
}

// A critical Xid's finding names the GPU, the Xid (with its meaning where NVIDIA's catalogue
// gives one for a GPU fault), when it came (UTC), and that only an operator ends it.
TEST(GpuHealthTest, AnXidFindingNamesTheXidWhenItCameAndWhatEndsIt) {
  const int64_t at = 1'764'950'624'000;  // 2025-12-05 16:03:44 UTC
  EXPECT_EQ(XidFault("00000000:01:00.0", 79, at),
            "GPU 00000000:01:00.0: Xid 79 (fallen off the bus) at 2025-12-05 16:03:44 UTC (an "
            "NVML event): its slot stays out of use until an operator puts it back; reset the "
            "GPU (nvidia-smi -r) or reboot the node, then drover uncordon NODE --slot SLOT");
  EXPECT_EQ(XidFault("00000000:01:00.0", 62, at + 999).substr(0, 70),
            "GPU 00000000:01:00.0: Xid 62 at 2025-12-05 16:03:44 UTC (an NVML event");
  EXPECT_NE(XidFault("b", 999, at).find("Xid 999 (an Xid NVML does not know)"), std::string::npos);
}

// --gpu-ignored-xids: numbers separated by commas, or none; anything else is refused naming
// the entry.
TEST(GpuHealthTest, AnXidListIsNumbersSeparatedByCommasOrNone) {
  EXPECT_EQ(*ParseXidList("13,31,109"), (std::vector<int>{13, 31, 109}));
  EXPECT_EQ(*ParseXidList("79"), (std::vector<int>{79}));
  EXPECT_TRUE(ParseXidList("none")->empty());
  EXPECT_TRUE(ParseXidList("")->empty());
  for (const char* bad : {"13,x", "13,,31", "-1", "13 ,31", "1e3", "13,", "9999999999"}) {
    StatusOr<std::vector<int>> xids = ParseXidList(bad);
    ASSERT_FALSE(xids.ok()) << bad;
    EXPECT_EQ(xids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(xids.status().message().find("is not an Xid"), std::string::npos) << xids.status();
  }
  EXPECT_EQ(ParseXidList("13,x").status().message(),
            "--gpu-ignored-xids: 'x' is not an Xid; give numbers separated by commas (e.g. "
            "13,31,43), or none");
}

// The clocks event reasons that slow a GPU down are named; idling, application clocks, sync
// boost and the power cap (where a GPU under full load sits) are not.
TEST(GpuHealthTest, SlowdownNamesOnlyTheReasonsThatHoldAGpuBack) {
  EXPECT_EQ(SlowdownReasons(0), "");
  EXPECT_EQ(SlowdownReasons(0x1 | 0x2 | 0x4 | 0x10 | 0x100), "");
  EXPECT_EQ(SlowdownReasons(0x40 | 0x8), "thermal (hardware)");
  EXPECT_EQ(SlowdownReasons(0x80 | 0x8 | 0x4), "power brake (hardware)");
  EXPECT_EQ(SlowdownReasons(0x20), "thermal (driver)");
  EXPECT_EQ(SlowdownReasons(0x8), "hardware slowdown");
  EXPECT_EQ(SlowdownReasons(0x40 | 0x20), "thermal (hardware), thermal (driver)");
}

// The check through NVML (the stand-in, fake_cuda_driver.cc): GPUs found by their bus ids,
// whatever their order in NVML; each fault reported for its slot, naming the GPU; a GPU
// that is mended passes again.
class GpuHealthCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Its own per test: ctest runs the tests side by side, each in a process of its own.
    state_ = std::filesystem::path(::testing::TempDir()) /
             ("nvml_state_" + std::to_string(getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove(state_);
    ASSERT_EQ(setenv("DROVER_FAKE_GPUS", "NVIDIA H200,141,90;NVIDIA H200,141,90", 1), 0);
    ASSERT_EQ(setenv("DROVER_FAKE_NVML", state_.c_str(), 1), 0);
  }
  void TearDown() override {
    unsetenv("DROVER_FAKE_GPUS");
    unsetenv("DROVER_FAKE_NVML");
  }
  void Say(const std::string& what) { std::ofstream(state_) << what; }

  std::filesystem::path state_;
};

TEST_F(GpuHealthCheckTest, AFaultyGpuIsReportedForItsSlotUntilItIsMended) {
  // Slot 0 is the node's GPU 00000000:01:00.0, slot 1 its 00000000:00:00.0 (as
  // CUDA_VISIBLE_DEVICES=1,0 would give them).
  std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:01:00.0"},
                               {1, "NVIDIA H200", 141LL << 30, 90, "00000000:00:00.0"}};
  auto check = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ((*check)->checked(), 2);
  EXPECT_TRUE((*check)->Check().empty());

  Say("00000000:00:00.0 ecc=2\n");
  std::vector<v1::SlotHealth> unfit = (*check)->Check();
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].slot(), 1);
  EXPECT_EQ(unfit[0].fault(),
            "GPU 00000000:00:00.0: 2 uncorrectable ECC errors since its last reset (NVML): "
            "reset the GPU (nvidia-smi -r)");

  Say("00000000:00:00.0 remap=pending\n00000000:01:00.0 lost\n");
  unfit = (*check)->Check();
  ASSERT_EQ(unfit.size(), 2u);
  EXPECT_EQ(unfit[0].slot(), 0);
  EXPECT_NE(unfit[0].fault().find("GPU 00000000:01:00.0: it has fallen off the bus"),
            std::string::npos)
      << unfit[0].fault();
  EXPECT_EQ(unfit[1].slot(), 1);
  EXPECT_NE(unfit[1].fault().find("a row remap of its memory waits for a reset"), std::string::npos)
      << unfit[1].fault();

  Say("00000000:01:00.0 remap=failed\n");
  unfit = (*check)->Check();
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].slot(), 0);
  EXPECT_NE(unfit[0].fault().find("could not be remapped"), std::string::npos);

  Say("");  // reset and repaired
  EXPECT_TRUE((*check)->Check().empty());
}

// An NVLink that was up when the check began and is down now makes its GPU unfit until it is
// up again; one down from the start, or a GPU without NVLink, is never a finding.
TEST_F(GpuHealthCheckTest, AnNvLinkUpAtTheStartAndDownNowMakesItsGpuUnfit) {
  std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:00:00.0"},
                               {1, "NVIDIA H200", 141LL << 30, 90, "00000000:01:00.0"},
                               {2, "NVIDIA H200", 141LL << 30, 90, "00000000:02:00.0"}};
  ASSERT_EQ(
      setenv("DROVER_FAKE_GPUS", "NVIDIA H200,141,90;NVIDIA H200,141,90;NVIDIA H200,141,90", 1), 0);
  Say("00000000:00:00.0 nvlinks=18 down=1\n00000000:01:00.0 nvlinks=18\n");
  auto check = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_TRUE((*check)->Check().empty());

  Say("00000000:00:00.0 nvlinks=18 down=1,2\n00000000:01:00.0 nvlinks=18 down=0,17\n");
  std::vector<v1::SlotHealth> unfit = (*check)->Check();
  ASSERT_EQ(unfit.size(), 2u);
  EXPECT_EQ(unfit[0].slot(), 0);
  EXPECT_EQ(unfit[0].fault(),
            "GPU 00000000:00:00.0: NVLink 2 is down (it was up when the agent began checking; "
            "NVML): reset the GPU (nvidia-smi -r), or have its NVLink serviced");
  EXPECT_EQ(unfit[1].slot(), 1);
  EXPECT_NE(unfit[1].fault().find("NVLinks 0, 17 are down"), std::string::npos) << unfit[1].fault();

  Say("00000000:00:00.0 nvlinks=18 down=1\n00000000:01:00.0 nvlinks=18\n");  // serviced
  EXPECT_TRUE((*check)->Check().empty());
}

// Each Xid event is handed on once, in order, naming the GPU by its index in the list given
// to Open; one NVML names no GPU for, with -1; no event, nothing once the wait is over.
TEST_F(GpuHealthCheckTest, EachXidEventIsHandedOnOnceForItsGpu) {
  std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:01:00.0"},
                               {1, "NVIDIA H200", 141LL << 30, 90, "00000000:00:00.0"}};
  auto check = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(check.ok()) << check.status();
  ASSERT_TRUE((*check)->watches_xids());
  EXPECT_FALSE((*check)->WaitForXid(10).has_value());

  Say("00000000:00:00.0 xid=79,13\n");
  std::optional<XidEvent> event = (*check)->WaitForXid(10000);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->gpu, 1);
  EXPECT_EQ(event->xid, 79u);
  event = (*check)->WaitForXid(10000);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->gpu, 1);
  EXPECT_EQ(event->xid, 13u);
  EXPECT_FALSE((*check)->WaitForXid(10).has_value());

  Say("00000000:00:00.0 xid=79,13\nunattributed xid=48\n");
  event = (*check)->WaitForXid(10000);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->gpu, -1);
  EXPECT_EQ(event->xid, 48u);
}

// A GPU whose driver offers no Xid events is not watched for them, and with none watched a
// wait only waits.
TEST_F(GpuHealthCheckTest, AGpuWhoseDriverOffersNoXidEventsIsNotWatched) {
  std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:00:00.0"}};
  Say("00000000:00:00.0 noxid\n");
  auto check = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_FALSE((*check)->watches_xids());
  Say("00000000:00:00.0 noxid xid=79\n");
  EXPECT_FALSE((*check)->WaitForXid(20).has_value());
  EXPECT_TRUE((*check)->Check().empty());
}

// What NVML answers of each GPU is read for its slot; what it does not answer is left absent.
TEST_F(GpuHealthCheckTest, TelemetryReadsWhatNvmlAnswersForTheSlot) {
  std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:01:00.0"},
                               {1, "NVIDIA H200", 141LL << 30, 90, "00000000:00:00.0"},
                               {2, "NVIDIA H200", 141LL << 30, 90, "00000000:42:00.0"}};
  auto check = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(check.ok()) << check.status();
  Say("00000000:00:00.0 util=97 used=61 temp=91 power=512 reasons=72\n");
  std::optional<v1::GpuTelemetry> hot = (*check)->Telemetry(1);
  ASSERT_TRUE(hot.has_value());
  EXPECT_EQ(hot->slot(), 1);
  EXPECT_EQ(hot->utilization_pct(), 97);
  EXPECT_EQ(hot->memory_used_bytes(), 61ULL << 30);
  EXPECT_EQ(hot->memory_total_bytes(), 141ULL << 30);
  EXPECT_EQ(hot->temperature_c(), 91);
  EXPECT_EQ(hot->power_mw(), 512'000);
  EXPECT_EQ(hot->slowdown(), "thermal (hardware)");

  std::optional<v1::GpuTelemetry> quiet = (*check)->Telemetry(0);
  ASSERT_TRUE(quiet.has_value());
  EXPECT_EQ(quiet->slot(), 0);
  EXPECT_FALSE(quiet->has_utilization_pct());
  EXPECT_FALSE(quiet->has_temperature_c());
  EXPECT_FALSE(quiet->has_power_mw());
  EXPECT_EQ(quiet->memory_used_bytes(), 0u);
  EXPECT_EQ(quiet->memory_total_bytes(), 141ULL << 30);
  EXPECT_EQ(quiet->slowdown(), "");

  EXPECT_FALSE((*check)->Telemetry(2).has_value());  // NVML does not know it
}

// A GPU NVML does not know (no bus id from the driver, or one NVML cannot find) is left
// unchecked, and the others are checked.
TEST_F(GpuHealthCheckTest, AGpuNvmlCannotFindIsLeftUnchecked) {
  std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:42:00.0"},
                               {1, "NVIDIA H200", 141LL << 30, 90, ""},
                               {2, "NVIDIA H200", 141LL << 30, 90, "00000000:01:00.0"}};
  auto check = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ((*check)->checked(), 1);
  Say("00000000:42:00.0 lost\n00000000:01:00.0 ecc=1\n");
  std::vector<v1::SlotHealth> unfit = (*check)->Check();
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].slot(), 2);
}

// No NVML, or one that will not start: refused with the cause, for the agent to say that its
// health checks are off.
TEST_F(GpuHealthCheckTest, NoUsableNvmlIsRefusedWithTheCause) {
  std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:00:00.0"}};
  auto missing = GpuHealthCheck::Open(gpus, "libdrover-no-such-nvml.so.1");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("libdrover-no-such-nvml.so.1 cannot be loaded"),
            std::string::npos)
      << missing.status();

  Say("init 9\n");
  auto refused = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(), "nvmlInit_v2 failed: Driver Not Loaded (9)");
}

}  // namespace
}  // namespace drover
