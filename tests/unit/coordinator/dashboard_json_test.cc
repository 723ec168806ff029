// coordinator/dashboard_json.h: what the dashboard's page reads of the cluster.
#include "coordinator/dashboard_json.h"

#include <gtest/gtest.h>

namespace drover::coordinator {
namespace {

// A GPU slot carries what its agent's NVML read last; a reading NVML did not answer is left
// out, and a slot without a reading has no "gpu" at all.
TEST(DashboardJsonTest, AGpuSlotCarriesItsLastReading) {
  v1::ListWorkersResponse workers;
  v1::WorkerInfo* w = workers.add_workers();
  w->mutable_node()->set_name("gpu0");
  w->mutable_node()->set_state(v1::NODE_ALIVE);
  for (int i = 0; i < 2; ++i) {
    v1::Slot* s = w->mutable_node()->add_slots();
    s->set_index(i);
    s->set_device(v1::CUDA);
  }
  v1::GpuTelemetry* g = w->add_gpus();
  g->set_slot(1);
  g->set_utilization_pct(97);
  g->set_memory_used_bytes(61LL << 30);
  g->set_memory_total_bytes(141LL << 30);
  g->set_power_mw(512'300);
  g->set_slowdown("thermal (hardware)");
  const nlohmann::json cluster = ClusterJson(workers, {}, 1'700'000'000'000);
  const nlohmann::json& slots = cluster["nodes"][0]["slots"];
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_FALSE(slots[0].contains("gpu"));
  const nlohmann::json& gpu = slots[1]["gpu"];
  EXPECT_EQ(gpu["utilization_pct"], 97);
  EXPECT_EQ(gpu["memory_used_bytes"], 61LL << 30);
  EXPECT_EQ(gpu["memory_total_bytes"], 141LL << 30);
  EXPECT_EQ(gpu["power_w"], 512.3);
  EXPECT_EQ(gpu["slowdown"], "thermal (hardware)");
  EXPECT_FALSE(gpu.contains("temperature_c"));
}

// A job's notices (what slows it where it runs) reach the page as they are.
TEST(DashboardJsonTest, AJobsNoticesAreListed) {
  v1::JobInfo info;
  info.mutable_job()->set_job_id("j1");
  info.add_notices("rank 1 on g1 slot 1: its GPU is slowed down (thermal (hardware), at 91 C)");
  const nlohmann::json job = JobJson(info, {}, 1'700'000'000'000);
  ASSERT_EQ(job["notices"].size(), 1u);
  EXPECT_EQ(job["notices"][0],
            "rank 1 on g1 slot 1: its GPU is slowed down (thermal (hardware), at 91 C)");
}

}  // namespace
}  // namespace drover::coordinator
