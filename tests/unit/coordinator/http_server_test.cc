#include "coordinator/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/exit_codes.h"
#include "coordinator/coordinator.h"
#include "coordinator/dashboard/page.h"
#include "tests/unit/coordinator/test_util.h"

namespace drover::coordinator {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RegisterReq;
using testing::SpecYaml;
using testing::Trainer;

// A coordinator on a fake clock with one node and one running job whose rank 0 reported
// steps 1..20, an evaluation at step 10, behind an HttpServer on a free loopback port.
class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions options;
    options.state_dir = ::testing::TempDir() + "/drover_http_" + std::to_string(getpid()) + "_" +
                        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(options.state_dir);
    auto c = Coordinator::Open(options, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
    auto reg = RegisterReq("node-a", 2);
    reg.mutable_slots(0)->set_description("cpu slot");
    ASSERT_TRUE(c_->Register(reg).ok());
    v1::SubmitJobRequest submit;
    submit.set_spec_yaml(SpecYaml(1, 1));
    auto id = c_->SubmitJob(submit);
    ASSERT_TRUE(id.ok()) << id.status();
    job_ = *id;
    c_->Tick();
    ASSERT_TRUE(c_->Flush().ok());
    for (int step = 1; step <= 20; ++step) {
      v1::TrainerStatus t = Trainer(job_, 1, 0, v1::TRAINER_RUNNING, step);
      t.mutable_progress()->set_loss(4.0 - 0.1 * step);
      t.mutable_progress()->set_lr(1e-3);
      t.mutable_progress()->set_tokens_per_s(800);
      if (step >= 10) {
        t.mutable_progress()->set_val_step(10);
        t.mutable_progress()->set_val_loss(3.5);
      }
      v1::HeartbeatRequest hb;
      hb.set_name("node-a");
      hb.set_agent_id("agent-1");
      *hb.add_trainers() = t;
      c_->Heartbeat(hb);
      clock_.AdvanceMs(1000);
    }
    source_ = DashboardSourceOf(c_.get());
    auto s = HttpServer::Start(source_.get(), &metrics_, "127.0.0.1:0");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
  }

  json GetJson(const std::string& path, int want_status = 200) {
    auto r = client_->Get(path);
    EXPECT_TRUE(r) << path << ": " << httplib::to_string(r.error());
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << path << ": " << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    return json::parse(r->body);
  }

  FakeClock clock_;
  std::unique_ptr<Coordinator> c_;
  std::string job_;
  CoordinatorMetrics metrics_;
  std::unique_ptr<DashboardSource> source_;
  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, ClusterShowsNodesSlotsAndWhichRankHoldsEach) {
  json c = GetJson("/api/cluster");
  ASSERT_EQ(c["nodes"].size(), 1u);
  const json& n = c["nodes"][0];
  EXPECT_EQ(n["name"], "node-a");
  EXPECT_EQ(n["state"], "alive");
  ASSERT_EQ(n["slots"].size(), 2u);
  EXPECT_EQ(n["slots"][0]["device"], "cpu");
  EXPECT_EQ(n["slots"][0]["description"], "cpu slot");
  // The one rank sits on one of the two slots; the other is free.
  int held = 0;
  for (const json& s : n["slots"]) {
    if (s.contains("job_id")) {
      ++held;
      EXPECT_EQ(s["job_id"], job_);
      EXPECT_EQ(s["job_name"], "t");
      EXPECT_EQ(s["rank"], 0);
    }
  }
  EXPECT_EQ(held, 1);
  EXPECT_EQ(n["free_slots"], 1);
  EXPECT_EQ(c["totals"]["slots"], 2);
  EXPECT_EQ(c["totals"]["alive"], 1);
}

TEST_F(HttpServerTest, JobsListsSummariesNewestFirst) {
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml(SpecYaml(2, 2));
  auto second = c_->SubmitJob(submit);
  ASSERT_TRUE(second.ok());
  json j = GetJson("/api/jobs");
  ASSERT_EQ(j["jobs"].size(), 2u);
  EXPECT_EQ(j["jobs"][0]["job_id"], *second);
  EXPECT_EQ(j["jobs"][0]["state"], "pending");
  EXPECT_EQ(j["jobs"][1]["job_id"], job_);
  EXPECT_EQ(j["jobs"][1]["state"], "running");
  EXPECT_EQ(j["jobs"][1]["step"], 20);
  EXPECT_DOUBLE_EQ(j["jobs"][1]["loss"].get<double>(), 2.0);
  EXPECT_FALSE(j["jobs"][1].contains("spec_yaml"));
  EXPECT_EQ(GetJson("/api/jobs?limit=1")["jobs"].size(), 1u);
}

TEST_F(HttpServerTest, JobShowsPlacementAttemptsAndItsHistory) {
  json j = GetJson("/api/jobs/" + job_);
  EXPECT_EQ(j["job"]["name"], "t");
  EXPECT_EQ(j["job"]["steps"], 10);  // from the spec
  ASSERT_EQ(j["placement"].size(), 1u);
  EXPECT_EQ(j["placement"][0]["node"], "node-a");
  EXPECT_EQ(j["placement"][0]["rank"], 0);
  EXPECT_EQ(j["placement"][0]["state"], "running");
  EXPECT_EQ(j["placement"][0]["step"], 20);
  ASSERT_EQ(j["attempts"].size(), 1u);
  EXPECT_EQ(j["attempts"][0]["attempt"], 1);
  EXPECT_EQ(j["attempts"][0]["nodes"], json::array({"node-a"}));
  const json& h = j["history"];
  EXPECT_EQ(h["memory_only"], true);
  ASSERT_EQ(h["points"].size(), 20u);
  // [attempt, step, time_ms, loss, lr, tokens_per_s]
  EXPECT_EQ(h["points"][0][0], 1);
  EXPECT_EQ(h["points"][0][1], 1);
  EXPECT_NEAR(h["points"][19][3].get<double>(), 2.0, 1e-12);
  EXPECT_DOUBLE_EQ(h["points"][19][4].get<double>(), 1e-3);
  EXPECT_DOUBLE_EQ(h["points"][19][5].get<double>(), 800);
  EXPECT_EQ(h["points"][19][2].get<int64_t>() - h["points"][0][2].get<int64_t>(), 19'000);
  // [attempt, step, time_ms, val_loss, hellaswag]: a job without data.hellaswag has none.
  ASSERT_EQ(h["evals"].size(), 1u);
  EXPECT_EQ(h["evals"][0][1], 10);
  EXPECT_DOUBLE_EQ(h["evals"][0][3].get<double>(), 3.5);
  EXPECT_TRUE(h["evals"][0][4].is_null());
}

TEST_F(HttpServerTest, ASlotWhoseDeviceFailedShowsItsCordonAndWhy) {
  const int slot = c_->GetJob(job_)->job().placement(0).slot();
  v1::TrainerExitRequest exit;
  exit.set_name("node-a");
  exit.set_agent_id("agent-1");
  *exit.mutable_trainer() = testing::Exited(job_, 1, 0, kExitDeviceFault);
  exit.mutable_trainer()->set_last_error("the GPU failed: cudaErrorECCUncorrectable");
  ASSERT_TRUE(c_->ReportTrainerExit(exit).ok());
  c_->Tick();  // the next attempt, on the other slot
  ASSERT_TRUE(c_->Flush().ok());
  json c = GetJson("/api/cluster");
  const json& n = c["nodes"][0];
  EXPECT_EQ(n["state"], "alive");
  EXPECT_EQ(n["free_slots"], 0);  // one slot runs the next attempt, the other is cordoned
  const json& failed = n["slots"][slot];
  EXPECT_EQ(failed["failures"], 1);
  EXPECT_THAT(failed["fault"].get<std::string>(), HasSubstr("cudaErrorECCUncorrectable"));
  EXPECT_GT(failed["cordon_until_ms"].get<int64_t>(), c["now_ms"].get<int64_t>());
  EXPECT_FALSE(failed.contains("job_id"));
  EXPECT_EQ(n["slots"][1 - slot]["job_id"], job_);
  EXPECT_FALSE(n["slots"][1 - slot].contains("failures"));
}

// A slot an operator cordoned alone: the dashboard marks it with who and why, and the node's
// free count leaves it out.
TEST_F(HttpServerTest, ASlotAnOperatorCordonedShowsWhoAndWhy) {
  const int slot = 1 - c_->GetJob(job_)->job().placement(0).slot();  // the free one
  v1::CordonRequest request;
  request.set_node("node-a");
  request.set_slot_only(true);
  request.set_slot(slot);
  request.set_requester("ops@h");
  request.set_reason("fan noise");
  ASSERT_TRUE(c_->Cordon(request).ok());
  ASSERT_TRUE(c_->Flush().ok());
  json c = GetJson("/api/cluster");
  const json& n = c["nodes"][0];
  EXPECT_EQ(n["state"], "alive");
  EXPECT_EQ(n["slots"][slot]["operator_cordon"], "cordoned by ops@h: fan noise");
  EXPECT_FALSE(n["slots"][1 - slot].contains("operator_cordon"));
  EXPECT_EQ(n["free_slots"], 0);  // one slot runs the job, the other is cordoned
}

// A slot its agent's health check reports unfit: the dashboard marks it with the fault, and
// the node's free count leaves it out.
TEST_F(HttpServerTest, ASlotItsAgentReportsUnfitShowsTheFault) {
  const int slot = c_->GetJob(job_)->job().placement(0).slot();
  v1::HeartbeatRequest hb;
  hb.set_name("node-a");
  hb.set_agent_id("agent-1");
  v1::SlotHealth* unfit = hb.add_unhealthy_slots();
  unfit->set_slot(slot);
  unfit->set_fault("GPU 00000000:19:00.0: it has fallen off the bus");
  c_->Heartbeat(hb);
  ASSERT_TRUE(c_->Flush().ok());
  json c = GetJson("/api/cluster");
  const json& n = c["nodes"][0];
  EXPECT_EQ(n["slots"][slot]["unfit"], "GPU 00000000:19:00.0: it has fallen off the bus");
  EXPECT_FALSE(n["slots"][1 - slot].contains("unfit"));
  EXPECT_EQ(n["free_slots"], 1);  // the other slot; the unfit one's job is stopped
}

TEST_F(HttpServerTest, RecoveryTimeIsShownOnTheRestartedAttempt) {
  v1::TrainerExitRequest exit;
  exit.set_name("node-a");
  exit.set_agent_id("agent-1");
  *exit.mutable_trainer() = testing::Exited(job_, 1, 0, 1);
  ASSERT_TRUE(c_->ReportTrainerExit(exit).ok());
  clock_.AdvanceMs(1500);
  c_->Tick();
  ASSERT_TRUE(c_->Flush().ok());
  json j = GetJson("/api/jobs/" + job_);
  ASSERT_EQ(j["attempts"].size(), 2u);
  EXPECT_THAT(j["attempts"][0]["end_reason"].get<std::string>(), HasSubstr("exited with code 1"));
  EXPECT_EQ(j["attempts"][1]["recovery_ms"], 1500);
  EXPECT_FALSE(j["attempts"][0].contains("recovery_ms"));
  EXPECT_FALSE(j["attempts"][1].contains("training_again_ms"));  // no step of it yet

  clock_.AdvanceMs(2000);
  v1::HeartbeatRequest hb;
  hb.set_name("node-a");
  hb.set_agent_id("agent-1");
  *hb.add_trainers() = Trainer(job_, 2, 0, v1::TRAINER_RUNNING, 21);
  c_->Heartbeat(hb);
  j = GetJson("/api/jobs/" + job_);
  EXPECT_EQ(j["attempts"][1]["training_again_ms"], 3500);
}

TEST_F(HttpServerTest, BadRequestsGetClearErrors) {
  json missing = GetJson("/api/jobs/no-such-job", 404);
  EXPECT_THAT(missing["error"].get<std::string>(), HasSubstr("no-such-job"));
  json bad = GetJson("/api/jobs?limit=lots", 400);
  EXPECT_THAT(bad["error"].get<std::string>(), HasSubstr("limit"));
  EXPECT_THAT(bad["error"].get<std::string>(), HasSubstr("lots"));
  auto r = client_->Get("/nowhere");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(r->body, HasSubstr("/api/jobs"));
}

TEST_F(HttpServerTest, MetricsAreServedInTheTextFormat) {
  auto r = client_->Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(r->body, HasSubstr("drover_jobs{state=\"running\"} 1"));
  EXPECT_THAT(r->body, HasSubstr("drover_job_step{job_id=\"" + job_ + "\",name=\"t\"} 20"));
  EXPECT_THAT(r->body, HasSubstr("drover_node_slots{node=\"node-a\"} 2"));
}

TEST_F(HttpServerTest, PageIsServedWithAPolicyThatForbidsFetchingElsewhere) {
  auto r = client_->Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->get_header_value("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(r->get_header_value("Content-Security-Policy"), HasSubstr("default-src 'none'"));
  EXPECT_EQ(r->body, std::string(DashboardPage()));
  EXPECT_THAT(r->body, HasSubstr("id=\"chart-loss\""));
}

TEST(DashboardPageTest, ReferencesNothingOutsideThePage) {
  const std::string page(DashboardPage());
  for (const char* needle : {"http://", "https://", "<link", "@import", "url(", " src="}) {
    EXPECT_THAT(page, Not(HasSubstr(needle))) << needle;
  }
}

TEST(HttpServerStartTest, MalformedAddressIsRefusedNamingIt) {
  CoordinatorMetrics metrics;
  for (const char* bad : {"8080", "localhost:", "localhost:http", "127.0.0.1:70000"}) {
    auto s = HttpServer::Start(nullptr, &metrics, bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(), HasSubstr(bad));
  }
}

}  // namespace
}  // namespace drover::coordinator
