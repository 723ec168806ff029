#include "worker/gpu_health_monitor.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "common/clock.h"

namespace drover {
namespace {

// The monitor's thread asks the stand-in NVML (fake_cuda_driver.cc) about two GPUs: slot 0 is
// bus 00000000:00:00.0, slot 1 is 00000000:01:00.0. "hang" in the state file keeps a query
// about that GPU from returning until the file says otherwise (and creates the file + ".hung").
class GpuHealthMonitorTest : public ::testing::Test {
 protected:
  static constexpr int kTimeoutMs = 15000;

  void SetUp() override {
    // Its own per test: ctest runs the tests side by side, each in a process of its own.
    state_ = std::filesystem::path(::testing::TempDir()) /
             ("nvml_monitor_state_" + std::to_string(getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    Say("");
    std::filesystem::remove(Hung());
    ASSERT_EQ(setenv("DROVER_FAKE_GPUS", "NVIDIA H200,141,90;NVIDIA H200,141,90", 1), 0);
    ASSERT_EQ(setenv("DROVER_FAKE_NVML", state_.c_str(), 1), 0);
  }
  void TearDown() override {
    Say("");  // a query still waiting returns
    unsetenv("DROVER_FAKE_GPUS");
    unsetenv("DROVER_FAKE_NVML");
  }
  void Say(const std::string& what) { std::ofstream(state_) << what; }
  std::filesystem::path Hung() const { return state_.string() + ".hung"; }
  // Waits (real time, up to 20 s) until a query is waiting in the stand-in NVML.
  void UntilAQueryHangs() {
    for (int i = 0; i < 4000 && !std::filesystem::exists(Hung()); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(std::filesystem::exists(Hung()));
  }

  std::unique_ptr<GpuHealthMonitor> Start(GpuHealthMonitor::Options options = {}) {
    std::vector<GpuInfo> gpus = {{0, "NVIDIA H200", 141LL << 30, 90, "00000000:00:00.0"},
                                 {1, "NVIDIA H200", 141LL << 30, 90, "00000000:01:00.0"}};
    auto check = GpuHealthCheck::Open(gpus, DROVER_FAKE_CUDA_DRIVER);
    EXPECT_TRUE(check.ok()) << check.status();
    if (!check.ok()) return nullptr;
    options.interval_ms = 5;
    options.timeout_ms = kTimeoutMs;
    return std::make_unique<GpuHealthMonitor>(std::move(*check), std::move(options), &clock_);
  }

  // Polls `monitor` (real time, up to 20 s) until `done` holds of its findings. The fake
  // clock stands still meanwhile: a healthy GPU's query that was under way when the test
  // moved it can look overdue, but only until it returns, and the next start after the move.
  std::vector<v1::SlotHealth> Until(
      GpuHealthMonitor& monitor,
      const std::function<bool(const std::vector<v1::SlotHealth>&)>& done) {
    std::vector<v1::SlotHealth> unfit;
    for (int i = 0; i < 4000; ++i) {
      unfit = monitor.Unfit();
      if (done(unfit)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return unfit;
  }
  static bool Is(const std::vector<v1::SlotHealth>& unfit, std::vector<int> slots) {
    if (unfit.size() != slots.size()) return false;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (unfit[i].slot() != slots[i]) return false;
    }
    return true;
  }

  std::filesystem::path state_;
  FakeClock clock_;
};

// The first round's findings are there once WaitForFirstRound returns (the agent registers
// with them); a GPU whose query does not return is reported unfit once it is overdue, while
// the other GPU goes on being checked on its own thread and the caller is never held up;
// when the query returns, the finding clears.
TEST_F(GpuHealthMonitorTest, AQueryThatDoesNotReturnReportsItsGpuUnfitOnceOverdue) {
  Say("00000000:00:00.0 ecc=2\n");
  auto monitor = Start();
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  std::vector<v1::SlotHealth> unfit = monitor->Unfit();
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].slot(), 0);
  EXPECT_NE(unfit[0].fault().find("2 uncorrectable ECC errors"), std::string::npos)
      << unfit[0].fault();

  Say("00000000:00:00.0 ecc=2\n00000000:01:00.0 hang\n");
  UntilAQueryHangs();
  clock_.AdvanceMs(kTimeoutMs);
  unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) {
    return Is(u, {0, 1}) && u[0].fault().find("ECC") != std::string::npos;
  });
  ASSERT_EQ(unfit.size(), 2u);
  EXPECT_EQ(unfit[0].slot(), 0);
  EXPECT_NE(unfit[0].fault().find("2 uncorrectable ECC errors"), std::string::npos);
  EXPECT_EQ(unfit[1].slot(), 1);
  EXPECT_EQ(unfit[1].fault(),
            "GPU 00000000:01:00.0: NVML has not answered a query about it within 15 s (a wedged "
            "driver or GPU): the node needs a GPU reset or a reboot");
  EXPECT_EQ(unfit[1].fault(), NvmlStallFault("00000000:01:00.0", kTimeoutMs));

  Say("00000000:01:00.0 hang\n");  // slot 0 mended while slot 1's query still waits
  unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {1}); });
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].slot(), 1);

  Say("");  // the query returns, and the GPUs are mended
  unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return u.empty(); });
  EXPECT_TRUE(unfit.empty()) << unfit[0].fault();
}

// A query under way for less than the timeout is no finding: a slow answer is not a fault.
TEST_F(GpuHealthMonitorTest, AQueryUnderWayForLessThanTheTimeoutIsNoFinding) {
  auto monitor = Start();
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  Say("00000000:01:00.0 hang\n");
  UntilAQueryHangs();
  clock_.AdvanceMs(kTimeoutMs - 1);
  EXPECT_TRUE(monitor->Unfit().empty());
  clock_.AdvanceMs(1);
  std::vector<v1::SlotHealth> unfit =
      Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {1}); });
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].slot(), 1);
  Say("");  // the query returns: the monitor's end need not leave it behind
}

// A critical Xid keeps its GPU out from then on, whatever its checks find later: the event is
// gone once read, and nothing NVML says afterwards shows that it was mended.
TEST_F(GpuHealthMonitorTest, ACriticalXidKeepsItsGpuOutFromThenOn) {
  auto monitor = Start();
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  Say("00000000:01:00.0 xid=79\n");
  std::vector<v1::SlotHealth> unfit =
      Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {1}); });
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].fault(), XidFault("00000000:01:00.0", 79, clock_.WallNowMs()));

  // Its checks find a fault too (the Xid's finding is the one shown), and the other GPU's
  // shows: the checks went on.
  Say("00000000:01:00.0 ecc=1\n00000000:00:00.0 ecc=1\n");
  unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {0, 1}); });
  ASSERT_EQ(unfit.size(), 2u);
  EXPECT_EQ(unfit[1].fault(), XidFault("00000000:01:00.0", 79, clock_.WallNowMs()));
  // Then they find nothing: the other GPU is back, this one stays out (40 rounds later).
  Say("");
  unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {1}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  unfit = monitor->Unfit();
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].fault(), XidFault("00000000:01:00.0", 79, clock_.WallNowMs()));
}

// An operator ends an Xid's finding (drover uncordon; the heartbeat reply's cleared latches
// reach ClearLatches): an id that is not its latch changes nothing, its own ends it, and a
// later critical Xid marks the GPU again, with a latch of its own. A check's finding has no
// latch: it ends by itself.
TEST_F(GpuHealthMonitorTest, AnOperatorEndsAnXidsFindingByItsLatch) {
  auto monitor = Start();
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  Say("00000000:01:00.0 xid=79\n00000000:00:00.0 ecc=1\n");
  std::vector<v1::SlotHealth> unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) {
    return Is(u, {0, 1});
  });
  ASSERT_EQ(unfit.size(), 2u);
  EXPECT_EQ(unfit[0].latch(), 0);
  const int64_t latch = unfit[1].latch();
  EXPECT_NE(latch, 0);
  const int64_t others[] = {latch + 1, 0};
  monitor->ClearLatches(others);
  EXPECT_TRUE(Is(monitor->Unfit(), {0, 1}));
  const int64_t its[] = {latch};
  monitor->ClearLatches(its);
  EXPECT_TRUE(Is(monitor->Unfit(), {0}));
  Say("00000000:01:00.0 xid=79,48\n");
  unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {1}); });
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].fault(), XidFault("00000000:01:00.0", 48, clock_.WallNowMs()));
  EXPECT_NE(unfit[0].latch(), 0);
  EXPECT_NE(unfit[0].latch(), latch);
}

// The Xids an application's error causes (13, 31, 43... by default) leave their GPU in use;
// the first critical one after them is the finding.
TEST_F(GpuHealthMonitorTest, AnApplicationsXidsLeaveTheGpuInUse) {
  auto monitor = Start();
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  // Delivered in this order: slot 0's, then slot 1's (the stand-in's order).
  Say("00000000:00:00.0 xid=43,109\n00000000:01:00.0 xid=13,31,94,48\n");
  std::vector<v1::SlotHealth> unfit =
      Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {1}); });
  ASSERT_EQ(unfit.size(), 1u);
  EXPECT_EQ(unfit[0].fault(), XidFault("00000000:01:00.0", 94, clock_.WallNowMs()));
}

// The Xids left alone are the options', and an Xid NVML names no GPU for takes out every GPU.
TEST_F(GpuHealthMonitorTest, TheXidsLeftAloneAreTheOptionsOnes) {
  auto monitor = Start({.ignored_xids = {79}});
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  Say("unattributed xid=79,13\n");
  std::vector<v1::SlotHealth> unfit = Until(*monitor, [](const std::vector<v1::SlotHealth>& u) {
    return Is(u, {0, 1});
  });
  ASSERT_EQ(unfit.size(), 2u);
  EXPECT_EQ(unfit[0].fault(), XidFault("00000000:00:00.0", 13, clock_.WallNowMs()));
  EXPECT_EQ(unfit[1].fault(), XidFault("00000000:01:00.0", 13, clock_.WallNowMs()));
}

// Each GPU's reading is its last check's; a GPU whose query is overdue has none (what it read
// before is stale).
TEST_F(GpuHealthMonitorTest, TelemetryIsTheLastChecksAndNoneForAnOverdueGpu) {
  Say("00000000:00:00.0 util=97\n00000000:01:00.0 util=3\n");
  auto monitor = Start();
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  std::vector<v1::GpuTelemetry> readings = monitor->Telemetry();
  ASSERT_EQ(readings.size(), 2u);
  EXPECT_EQ(readings[0].slot(), 0);
  EXPECT_EQ(readings[0].utilization_pct(), 97);
  EXPECT_EQ(readings[1].slot(), 1);
  EXPECT_EQ(readings[1].utilization_pct(), 3);

  Say("00000000:00:00.0 util=97\n00000000:01:00.0 hang\n");
  UntilAQueryHangs();
  clock_.AdvanceMs(kTimeoutMs);
  Until(*monitor, [](const std::vector<v1::SlotHealth>& u) { return Is(u, {1}); });
  readings = monitor->Telemetry();
  ASSERT_EQ(readings.size(), 1u);
  EXPECT_EQ(readings[0].slot(), 0);
  Say("");  // the query returns
}

// Only a crash or a hang fails this: the monitor's end does not wait for a query that never
// returns (the agent's own exit would hang on it).
TEST_F(GpuHealthMonitorTest, ItsEndDoesNotHangOnAQueryThatNeverReturns) {
  auto monitor = Start();
  ASSERT_NE(monitor, nullptr);
  monitor->WaitForFirstRound();
  Say("00000000:00:00.0 hang\n");
  UntilAQueryHangs();
  monitor.reset();
  EXPECT_EQ(GpuHealthMonitor::RunningThreads(), 1);  // left behind, in NVML
  Say("");
  // The query returns and the thread ends, before the fixture's end changes the environment
  // the stand-in NVML reads.
  for (int i = 0; i < 4000 && GpuHealthMonitor::RunningThreads() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(GpuHealthMonitor::RunningThreads(), 0);
}

}  // namespace
}  // namespace drover
