// cli/slots_out.h: the lines under `drover workers`' table.
#include "cli/slots_out.h"

#include <gtest/gtest.h>

namespace drover::cli {
namespace {

constexpr int64_t kNow = 1'000'000;
constexpr char kEcc[] =
    "GPU 00000000:01:00.0: 1 uncorrectable ECC error since its last reset (NVML): reset the GPU "
    "(nvidia-smi -r)";

v1::SlotFault Cordon(int slot, int64_t until_ms, int failures, const std::string& reason) {
  v1::SlotFault f;
  f.set_slot(slot);
  f.set_cordon_until_ms(until_ms);
  f.set_failures(failures);
  f.set_reason(reason);
  return f;
}

v1::SlotHealth Unfit(int slot, const std::string& fault) {
  v1::SlotHealth h;
  h.set_slot(slot);
  h.set_fault(fault);
  return h;
}

TEST(SlotsOutTest, TheFailuresCellSaysHowLongAgoTheLastFailureWas) {
  v1::NodeRecord n;
  EXPECT_EQ(FailuresCell(n, kNow), "0");
  n.set_failures(2);
  EXPECT_EQ(FailuresCell(n, kNow), "2");  // a record from before failure times
  n.set_last_failure_ms(kNow - 312'000);
  EXPECT_EQ(FailuresCell(n, kNow), "2 (last 5m12s ago)");
}

// A slot cordoned for the health check's finding that still holds: one line, naming both
// what keeps it out; a cordon for another cause, or one ended, is its own line or none.
TEST(SlotsOutTest, AnOperatorsCordonSaysWhoWhySinceWhenAndWhatEndsIt) {
  v1::NodeRecord n;
  n.set_name("w2");
  EXPECT_EQ(OperatorCordonLine(n, kNow), "") << "none";
  n.set_operator_cordon("drained by ops@h: new NIC");
  n.set_operator_cordon_ms(kNow - 312'000);
  EXPECT_EQ(OperatorCordonLine(n, kNow),
            "w2: drained by ops@h: new NIC, 5m12s ago (until drover uncordon w2)");
  n.set_operator_cordon_ms(kNow + 5000);  // a clock that stepped back: no age
  EXPECT_EQ(OperatorCordonLine(n, kNow),
            "w2: drained by ops@h: new NIC (until drover uncordon w2)");
  // drover drain --grace 10m.
  n.set_drain(true);
  n.set_drain_grace_ms(600'000);
  n.set_operator_cordon_ms(kNow - 312'000);
  EXPECT_EQ(OperatorCordonLine(n, kNow),
            "w2: drained by ops@h: new NIC (trainers given 10m00s to leave), 5m12s ago (until "
            "drover uncordon w2)");
}

TEST(SlotsOutTest, AnOperatorsCordonOfOneSlotSaysWhoWhySinceWhenAndHowToEndIt) {
  v1::NodeRecord n;
  n.set_name("gpu0");
  v1::SlotFault* f = n.add_slot_faults();
  f->set_slot(3);
  f->set_operator_cordon("cordoned by ops@h: fan noise");
  f->set_operator_cordon_ms(kNow - 312'000);
  EXPECT_EQ(SlotsOutLines(n, kNow),
            (std::vector<std::string>{"gpu0 slot 3: cordoned by ops@h: fan noise, 5m12s ago "
                                      "(until drover uncordon gpu0 --slot 3)"}));
  // A failure's cordon of the same slot meanwhile: its own line after it.
  f->set_failures(1);
  f->set_cordon_until_ms(kNow + 289'000);
  f->set_reason("job j's rank 0: ECC");
  EXPECT_EQ(SlotsOutLines(n, kNow),
            (std::vector<std::string>{"gpu0 slot 3: cordoned by ops@h: fan noise, 5m12s ago "
                                      "(until drover uncordon gpu0 --slot 3)",
                                      "gpu0 slot 3 cordoned for 4m49s (1 failure): job j's "
                                      "rank 0: ECC"}));
}

TEST(SlotsOutTest, ASlotCordonedForTheFindingThatStillHoldsIsOneLine) {
  v1::NodeRecord n;
  n.set_name("gpu0");
  *n.add_slot_faults() =
      Cordon(1, kNow + 289'000, 1, std::string("its GPU failed the node's health check: ") + kEcc);
  *n.add_unhealthy_slots() = Unfit(1, kEcc);
  EXPECT_EQ(SlotsOutLines(n, kNow),
            (std::vector<std::string>{
                std::string("gpu0 slot 1 out until its GPU passes the health check, and cordoned "
                            "for 4m49s (1 failure): ") +
                kEcc}));

  // Its cordon over: the finding alone.
  EXPECT_EQ(SlotsOutLines(n, kNow + 289'000),
            (std::vector<std::string>{
                std::string("gpu0 slot 1 out until its GPU passes the health check: ") + kEcc}));

  // Cordoned for a trainer's exit, then found unfit for something else: two lines.
  *n.mutable_slot_faults(0) = Cordon(1, kNow + 60'000, 2, "job 7 attempt 2: rank 1 exited with 3");
  *n.add_slot_faults() = Cordon(0, kNow + 1'000, 1, "job 7 attempt 1: rank 0 exited with 3");
  EXPECT_EQ(
      SlotsOutLines(n, kNow),
      (std::vector<std::string>{
          "gpu0 slot 1 cordoned for 1m00s (2 failures): job 7 attempt 2: rank 1 exited with 3",
          "gpu0 slot 0 cordoned for 1.0s (1 failure): job 7 attempt 1: rank 0 exited with 3",
          std::string("gpu0 slot 1 out until its GPU passes the health check: ") + kEcc}));
}

// A latched finding (a critical Xid) says that an operator ends it, and how.
TEST(SlotsOutTest, ALatchedFindingNamesTheUncordonThatEndsIt) {
  v1::NodeRecord n;
  n.set_name("gpu0");
  v1::SlotHealth xid = Unfit(1, "GPU 00000000:01:00.0: Xid 79 (fallen off the bus)");
  xid.set_latch(4242);
  *n.add_unhealthy_slots() = xid;
  EXPECT_EQ(SlotsOutLines(n, kNow),
            (std::vector<std::string>{"gpu0 slot 1 out until an operator puts it back (drover "
                                      "uncordon gpu0 --slot 1): GPU 00000000:01:00.0: Xid 79 "
                                      "(fallen off the bus)"}));
}

// A slot cordoned because its rank was a straggler says it was slow, not that it failed.
TEST(SlotsOutTest, AStragglersSlotIsToldSlowNotFailed) {
  v1::NodeRecord n;
  n.set_name("w1");
  const std::string why = "job 9: straggler rank 1 on w1 slot 0 (busy 81 ms a step ...)";
  v1::SlotFault f = Cordon(0, kNow + 299'000, 1, why);
  f.set_slow(1);
  *n.add_slot_faults() = f;
  EXPECT_EQ(SlotsOutLines(n, kNow),
            std::vector<std::string>{"w1 slot 0 cordoned for 4m59s (slow once): " + why});
  n.mutable_slot_faults(0)->set_failures(3);
  n.mutable_slot_faults(0)->set_slow(2);
  EXPECT_EQ(
      SlotsOutLines(n, kNow),
      std::vector<std::string>{"w1 slot 0 cordoned for 4m59s (1 failure, slow 2 times): " + why});
}

// A GPU the hardware slows down is named under the table, whatever --gpus says; --gpus'
// table shows each reading, "-" where NVML did not answer.
TEST(SlotsOutTest, ASlowedGpuIsNamedAndTheGpuTableShowsEachReading) {
  v1::WorkerInfo w;
  w.mutable_node()->set_name("gpu0");
  v1::GpuTelemetry* hot = w.add_gpus();
  hot->set_slot(0);
  hot->set_utilization_pct(97);
  hot->set_memory_used_bytes(61LL << 30);
  hot->set_memory_total_bytes(141LL << 30);
  hot->set_temperature_c(91);
  hot->set_power_mw(511'600);
  hot->set_slowdown("thermal (hardware)");
  w.add_gpus()->set_slot(1);
  EXPECT_EQ(SlowedGpuLines(w),
            (std::vector<std::string>{
                "gpu0 slot 0: its GPU is slowed down (thermal (hardware), at 91 C): every rank of "
                "its job waits for it at each step"}));
  EXPECT_EQ(GpuRows(w),
            (std::vector<std::vector<std::string>>{
                {"gpu0", "0", "97%", "61.0/141.0 GiB", "91 C", "512 W", "thermal (hardware)"},
                {"gpu0", "1", "-", "-", "-", "-", "-"}}));
  EXPECT_EQ(GpuTableHeader().size(), GpuRows(w)[0].size());
}

}  // namespace
}  // namespace drover::cli
