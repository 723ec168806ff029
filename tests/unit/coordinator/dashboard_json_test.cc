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

// A job with a time limit shows it and what its attempts have run of it: the ended one's
// whole run and the running one's until now, not the wait between them. One without a limit
// shows neither.
TEST(DashboardJsonTest, AJobsTimeLimitAndTheTimeItsAttemptsUsedAreShown) {
  constexpr int64_t kNow = 1'700'000'000'000;
  v1::JobInfo info;
  info.mutable_job()->set_job_id("j1");
  info.mutable_job()->set_state(v1::RUNNING);
  info.mutable_job()->set_attempt(2);
  info.mutable_job()->set_spec_yaml(
      "name: j\ndata: {train: t.bin}\nresources: {time_limit_minutes: 2}\n");
  v1::AttemptRecord* a1 = info.add_attempts();
  a1->set_attempt(1);
  a1->set_started_ms(kNow - 50'000);
  a1->set_ended_ms(kNow - 30'000);
  v1::AttemptRecord* a2 = info.add_attempts();
  a2->set_attempt(2);
  a2->set_started_ms(kNow - 12'000);
  nlohmann::json job = JobJson(info, {}, kNow)["job"];
  EXPECT_EQ(job["time_limit_ms"], 120'000);
  EXPECT_EQ(job["time_used_ms"], 32'000);
  info.mutable_job()->set_spec_yaml("name: j\ndata: {train: t.bin}\n");
  job = JobJson(info, {}, kNow)["job"];
  EXPECT_FALSE(job.contains("time_limit_ms"));
  EXPECT_FALSE(job.contains("time_used_ms"));
}

// Each placed rank shows its busy time once it has one, and whether it is a straggler.
TEST(DashboardJsonTest, EachRankShowsItsBusyTimeAndWhetherItIsAStraggler) {
  v1::JobInfo info;
  info.mutable_job()->set_job_id("j1");
  info.mutable_job()->set_attempt(3);
  for (int rank = 0; rank < 3; ++rank) {
    v1::RankAssignment* p = info.mutable_job()->add_placement();
    p->set_rank(rank);
    p->set_node("n1");
    p->set_slot(rank);
    v1::TrainerStatus* t = info.add_trainers();
    t->set_attempt(3);
    t->set_rank(rank);
    t->set_state(v1::TRAINER_RUNNING);
    t->mutable_progress()->set_busy_ms(rank == 2 ? 0 : 80.0 + 70 * rank);
  }
  info.add_straggler_ranks(1);
  const nlohmann::json job = JobJson(info, {}, 1'700'000'000'000);
  const nlohmann::json& ranks = job["placement"];
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[0]["busy_ms"], 80.0);
  EXPECT_EQ(ranks[1]["busy_ms"], 150.0);
  EXPECT_FALSE(ranks[2].contains("busy_ms"));  // too few steps yet
  EXPECT_EQ(ranks[0]["straggler"], false);
  EXPECT_EQ(ranks[1]["straggler"], true);
  EXPECT_EQ(ranks[2]["straggler"], false);
}

}  // namespace
}  // namespace drover::coordinator
