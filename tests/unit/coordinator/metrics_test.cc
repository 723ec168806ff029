#include "coordinator/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace drover::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kNow = 1'700'000'100'000;

// The value of the series written exactly as `series` (name and labels), or NaN.
double Value(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nan("");
}

ClusterSnapshot KnownState() {
  ClusterSnapshot s;
  s.now_ms = kNow;
  s.jobs_by_state = {{v1::RUNNING, 1}, {v1::FAILED, 2}, {v1::SUSPENDED, 4}};
  v1::WorkerInfo* alive = &s.workers.emplace_back();
  alive->mutable_node()->set_name("w0");
  alive->mutable_node()->set_state(v1::NODE_ALIVE);
  alive->mutable_node()->set_last_heartbeat_ms(kNow - 1500);
  alive->mutable_node()->add_slots()->set_index(0);
  alive->mutable_node()->add_slots()->set_index(1);
  alive->set_free_slots(1);
  v1::GpuTelemetry* g0 = alive->add_gpus();  // every reading, and slowed down
  g0->set_slot(0);
  g0->set_utilization_pct(97);
  g0->set_memory_used_bytes(61LL << 30);
  g0->set_memory_total_bytes(141LL << 30);
  g0->set_temperature_c(88);
  g0->set_power_mw(512'300);
  g0->set_slowdown("thermal (hardware)");
  v1::GpuTelemetry* g1 = alive->add_gpus();  // NVML answered nothing but its slot
  g1->set_slot(1);
  v1::WorkerInfo* dead = &s.workers.emplace_back();
  dead->mutable_node()->set_name("w1");
  dead->mutable_node()->set_state(v1::NODE_DEAD);
  dead->mutable_node()->set_failures(3);
  dead->mutable_node()->set_last_heartbeat_ms(kNow - 60'000);
  dead->mutable_node()->add_slots()->set_index(0);

  v1::JobInfo& job = s.live_jobs.emplace_back();
  v1::JobRecord* rec = job.mutable_job();
  rec->set_job_id("j1");
  rec->set_name("gpt");
  rec->set_state(v1::RUNNING);
  rec->set_attempt(2);
  rec->set_restarts(1);
  rec->set_last_step(40);
  rec->set_last_loss(2.75);
  rec->set_tokens_per_s(1234);
  v1::AttemptRecord* a1 = job.add_attempts();
  a1->set_attempt(1);
  a1->set_started_ms(kNow - 20'000);
  a1->set_ended_ms(kNow - 10'000);
  a1->set_end_reason("rank 0 exited with code 4");
  v1::AttemptRecord* a2 = job.add_attempts();
  a2->set_attempt(2);
  a2->set_started_ms(kNow - 7'500);
  rec->set_spec_yaml("name: gpt\ndata: {train: t.bin}\nresources: {time_limit_minutes: 1.5}\n");
  v1::TrainerStatus* t = job.add_trainers();
  t->set_job_id("j1");
  t->set_attempt(2);
  t->set_rank(0);
  t->mutable_progress()->set_step(40);
  t->mutable_progress()->set_lr(0.0005);
  t->mutable_progress()->set_val_step(30);
  t->mutable_progress()->set_val_loss(2.5);
  t->mutable_progress()->set_hellaswag_step(30);
  t->mutable_progress()->set_hellaswag(0.3125);
  t->mutable_progress()->set_mfu(0.25);
  t->mutable_progress()->set_busy_ms(80);
  v1::TrainerStatus* slow = job.add_trainers();
  slow->set_job_id("j1");
  slow->set_attempt(2);
  slow->set_rank(1);
  slow->mutable_progress()->set_step(40);
  slow->mutable_progress()->set_busy_ms(150);
  v1::TrainerStatus* early = job.add_trainers();  // of the last attempt: no series
  early->set_job_id("j1");
  early->set_attempt(1);
  early->set_rank(2);
  early->mutable_progress()->set_busy_ms(70);
  job.add_straggler_ranks(1);
  v1::CheckpointRecord* c = job.add_checkpoints();
  c->set_step(30);
  c->set_created_ms(kNow - 30'000);
  return s;
}

// A node whose trainers are leaving (drover drain, or its agent stopping) is counted as
// draining, its slots unavailable, whatever its record's state; once they have left, an
// operator's drain leaves it cordoned.
TEST(CoordinatorMetricsTest, ADrainingNodeIsCountedAsDrainingWithItsSlotsUnavailable) {
  CoordinatorMetrics m;
  ClusterSnapshot s = KnownState();
  s.workers[0].set_draining(true);
  std::string text = m.Render(s);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="draining"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="alive"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_slots{state="free"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_slots{state="in_use"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_slots{state="unavailable"})"), 3);  // w0's two, w1's one
  s.workers[0].set_draining(false);
  s.workers[0].mutable_node()->set_state(v1::NODE_CORDONED);
  s.workers[0].mutable_node()->set_operator_cordon("drained by ops@h");
  text = m.Render(s);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="draining"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="cordoned"})"), 1);
}

TEST(CoordinatorMetricsTest, RendersTheKnownStateWithItsNamesLabelsAndValues) {
  CoordinatorMetrics m;
  m.ObserveRpc("WorkerService/Heartbeat", "OK", 0.002);
  m.ObserveRpc("WorkerService/Heartbeat", "OK", 0.003);
  m.ObserveRpc("JobService/GetJob", "NOT_FOUND", 0.001);
  m.ObserveRpc("WorkerService/Watch", "CANCELLED", -1);  // a stream: counted, not timed
  const std::string text = m.Render(KnownState());

  EXPECT_EQ(Value(text, R"(drover_jobs{state="running"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_jobs{state="failed"})"), 2);
  EXPECT_EQ(Value(text, R"(drover_jobs{state="pending"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_jobs{state="suspended"})"), 4);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="alive"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="dead"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="cordoned"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="draining"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_slots{state="free"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_slots{state="in_use"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_slots{state="unavailable"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_node_heartbeat_age_seconds{node="w0"})"), 1.5);
  EXPECT_EQ(Value(text, R"(drover_node_failures{node="w1"})"), 3);
  EXPECT_EQ(Value(text, R"(drover_node_slots{node="w0"})"), 2);

  const std::string job = R"({job_id="j1",name="gpt"})";
  EXPECT_EQ(Value(text, "drover_job_attempt" + job), 2);
  EXPECT_EQ(Value(text, "drover_job_restarts" + job), 1);
  EXPECT_EQ(Value(text, "drover_job_step" + job), 40);
  EXPECT_EQ(Value(text, "drover_job_loss" + job), 2.75);
  EXPECT_EQ(Value(text, "drover_job_tokens_per_second" + job), 1234);
  EXPECT_EQ(Value(text, "drover_job_learning_rate" + job), 0.0005);
  EXPECT_EQ(Value(text, "drover_job_val_loss" + job), 2.5);
  EXPECT_EQ(Value(text, "drover_job_hellaswag_ratio" + job), 0.3125);
  EXPECT_EQ(Value(text, "drover_job_mfu_ratio" + job), 0.25);
  EXPECT_EQ(Value(text, "drover_job_checkpoint_age_seconds" + job), 30);
  EXPECT_EQ(Value(text, "drover_job_last_recovery_seconds" + job), 2.5);
  // Its limit, and the 10 s of its failed attempt and 7.5 s of its running one, not the 2.5 s
  // between them.
  EXPECT_EQ(Value(text, "drover_job_time_limit_seconds" + job), 90);
  EXPECT_EQ(Value(text, "drover_job_time_used_seconds" + job), 17.5);

  EXPECT_EQ(Value(text, "drover_job_recovery_seconds_count"), 1);
  EXPECT_EQ(Value(text, "drover_job_recovery_seconds_sum"), 2.5);
  EXPECT_EQ(Value(text, R"(drover_job_recovery_seconds_bucket{le="2"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_job_recovery_seconds_bucket{le="5"})"), 1);

  EXPECT_EQ(Value(text, R"(drover_rpc_requests_total{code="OK",method="WorkerService/Heartbeat"})"),
            2);
  EXPECT_EQ(
      Value(text, R"(drover_rpc_requests_total{code="NOT_FOUND",method="JobService/GetJob"})"), 1);
  EXPECT_EQ(
      Value(text, R"(drover_rpc_requests_total{code="CANCELLED",method="WorkerService/Watch"})"),
      1);
  EXPECT_EQ(Value(text, R"(drover_rpc_duration_seconds_count{method="WorkerService/Heartbeat"})"),
            2);
  EXPECT_NEAR(Value(text, R"(drover_rpc_duration_seconds_sum{method="WorkerService/Heartbeat"})"),
              0.005, 1e-12);
  EXPECT_THAT(text,
              Not(HasSubstr(R"(drover_rpc_duration_seconds_count{method="WorkerService/Watch"})")));
  EXPECT_THAT(text, HasSubstr("# TYPE drover_rpc_requests_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE drover_job_recovery_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# HELP drover_jobs "));
}

TEST(CoordinatorMetricsTest, ASlotCordonedForItsGpuIsUnavailableWhileItsNodeIsAlive) {
  ClusterSnapshot s = KnownState();
  // w0: slot 0 runs a trainer, slot 1's GPU failed and is out for another minute.
  v1::WorkerInfo& w0 = s.workers[0];
  w0.set_free_slots(0);
  v1::SlotFault* f = w0.mutable_node()->add_slot_faults();
  f->set_slot(1);
  f->set_failures(1);
  f->set_cordon_until_ms(kNow + 60'000);
  std::string text = CoordinatorMetrics().Render(s);
  EXPECT_EQ(Value(text, R"(drover_nodes{state="alive"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_slots{state="free"})"), 0);
  EXPECT_EQ(Value(text, R"(drover_slots{state="in_use"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_slots{state="unavailable"})"), 2);  // w1's, and w0's slot 1
  // Its cordon over, the slot counts as any other.
  f->set_cordon_until_ms(kNow);
  w0.set_free_slots(1);
  text = CoordinatorMetrics().Render(s);
  EXPECT_EQ(Value(text, R"(drover_slots{state="free"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_slots{state="unavailable"})"), 1);
}

// Each GPU's readings are series labelled by node and slot; a reading NVML did not answer
// is left out, not zero.
TEST(CoordinatorMetricsTest, GpuReadingsAreSeriesBySlotAndUnansweredOnesAreLeftOut) {
  const std::string text = CoordinatorMetrics().Render(KnownState());
  EXPECT_EQ(Value(text, R"(drover_gpu_utilization_ratio{node="w0",slot="0"})"), 0.97);
  EXPECT_EQ(Value(text, R"(drover_gpu_memory_used_bytes{node="w0",slot="0"})"), 61.0 * (1 << 30));
  EXPECT_EQ(Value(text, R"(drover_gpu_memory_total_bytes{node="w0",slot="0"})"), 141.0 * (1 << 30));
  EXPECT_EQ(Value(text, R"(drover_gpu_temperature_celsius{node="w0",slot="0"})"), 88);
  EXPECT_EQ(Value(text, R"(drover_gpu_power_watts{node="w0",slot="0"})"), 512.3);
  EXPECT_EQ(Value(text, R"(drover_gpu_slowed_down{node="w0",slot="0"})"), 1);
  EXPECT_EQ(Value(text, R"(drover_gpu_slowed_down{node="w0",slot="1"})"), 0);
  EXPECT_THAT(text, Not(HasSubstr(R"(drover_gpu_utilization_ratio{node="w0",slot="1"})")));
  EXPECT_THAT(text, Not(HasSubstr(R"(drover_gpu_memory_used_bytes{node="w0",slot="1"})")));
  EXPECT_THAT(text, Not(HasSubstr(R"(drover_gpu_temperature_celsius{node="w0",slot="1"})")));
  EXPECT_THAT(text, Not(HasSubstr(R"(drover_gpu_power_watts{node="w0",slot="1"})")));
}

TEST(CoordinatorMetricsTest, EachRanksBusyTimeIsASeriesAndStragglersAreCounted) {
  const std::string text = CoordinatorMetrics().Render(KnownState());
  EXPECT_EQ(Value(text, R"(drover_job_rank_busy_seconds{job_id="j1",name="gpt",rank="0"})"), 0.08);
  EXPECT_EQ(Value(text, R"(drover_job_rank_busy_seconds{job_id="j1",name="gpt",rank="1"})"), 0.15);
  EXPECT_THAT(text, Not(HasSubstr(R"(rank="2")")));
  EXPECT_EQ(Value(text, R"(drover_job_stragglers{job_id="j1",name="gpt"})"), 1);
}

TEST(CoordinatorMetricsTest, RecoveryIsCountedOnceHoweverOftenItIsScraped) {
  CoordinatorMetrics m;
  m.Render(KnownState());
  const std::string text = m.Render(KnownState());
  EXPECT_EQ(Value(text, "drover_job_recovery_seconds_count"), 1);
}

TEST(CoordinatorMetricsTest, FinishedJobLeavesNoSeriesBehind) {
  CoordinatorMetrics m;
  m.Render(KnownState());
  ClusterSnapshot later = KnownState();
  later.live_jobs.clear();
  const std::string text = m.Render(later);
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"j1\"")));
  EXPECT_EQ(Value(text, "drover_job_recovery_seconds_count"), 1);  // counted, not forgotten
}

TEST(CoordinatorMetricsTest, UnknownMfuAndNoEvaluationAreLeftOutNotZero) {
  ClusterSnapshot s = KnownState();
  v1::TrainerProgress* p = s.live_jobs[0].mutable_trainers(0)->mutable_progress();
  p->set_mfu(0);
  p->set_val_step(0);
  p->set_hellaswag_step(0);
  s.live_jobs[0].clear_checkpoints();
  const std::string text = CoordinatorMetrics().Render(s);
  EXPECT_THAT(text, Not(HasSubstr("drover_job_mfu_ratio{")));
  EXPECT_THAT(text, Not(HasSubstr("drover_job_val_loss{")));
  EXPECT_THAT(text, Not(HasSubstr("drover_job_hellaswag_ratio{")));
  EXPECT_THAT(text, Not(HasSubstr("drover_job_checkpoint_age_seconds{")));
}

// promtool is Prometheus's own checker (Debian package `prometheus`): it parses the
// exposition and lints names, types, units and help texts.
TEST(CoordinatorMetricsTest, PromtoolAcceptsTheExposition) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    FAIL() << "promtool not found: install Debian's `prometheus` package "
              "(deploy/install-deps.sh does)";
  }
  CoordinatorMetrics m;
  m.ObserveRpc("WorkerService/Heartbeat", "OK", 0.002);
  const std::string path =
      ::testing::TempDir() + "/drover_metrics_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << m.Render(KnownState());
  const std::string out = path + ".promtool";
  const int rc = std::system(("promtool check metrics < " + path + " > " + out + " 2>&1").c_str());
  std::ifstream in(out);
  std::stringstream said;
  said << in.rdbuf();
  EXPECT_EQ(rc, 0) << said.str();
  EXPECT_EQ(said.str(), "") << "promtool's lint findings";
  std::remove(path.c_str());
  std::remove(out.c_str());
}

}  // namespace
}  // namespace drover::coordinator
