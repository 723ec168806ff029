// The coordinator as a shared service: deleting finished jobs (drover rm, retention),
// deduplicated submits, per-submitter and size limits, and the live worker listing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "coordinator/coordinator.h"
#include "tests/unit/coordinator/test_util.h"

namespace drover::coordinator {
namespace {

using testing::Exited;
using ::testing::HasSubstr;
using testing::RegisterReq;
using testing::SpecYaml;
using testing::Trainer;

class CoordinatorLimitsTest : public ::testing::Test {
 protected:
  CoordinatorLimitsTest() {
    options_.state_dir = ::testing::TempDir() + "/drover_coord_limits_" + std::to_string(getpid()) +
                         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(options_.state_dir);
    Reopen();
  }
  ~CoordinatorLimitsTest() override { std::filesystem::remove_all(options_.state_dir); }
  void Reopen() {
    c_.reset();
    auto c = Coordinator::Open(options_, &clock_);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
  }
  StatusOr<std::string> Submit(const std::string& submitter = "",
                               const std::string& request_id = "",
                               const std::string& yaml = SpecYaml(1, 1)) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_submitter(submitter);
    req.set_request_id(request_id);
    return c_->SubmitJob(req);
  }
  int Listed() { return c_->ListJobs().jobs_size(); }
  std::string LogDir(const std::string& id) { return options_.state_dir + "/logs/" + id; }

  FakeClock clock_;
  CoordinatorOptions options_;
  std::unique_ptr<Coordinator> c_;
};

TEST_F(CoordinatorLimitsTest, DeleteRefusesALiveJobAndForgetsAFinishedOneForGood) {
  auto id = Submit();
  ASSERT_TRUE(id.ok()) << id.status();
  v1::AppendLogsRequest log;
  log.set_job_id(*id);
  log.set_attempt(1);
  log.set_data("hello\n");
  ASSERT_TRUE(c_->AppendLogs(log).ok());
  ASSERT_TRUE(std::filesystem::exists(LogDir(*id)));

  Status live = c_->DeleteJob(*id);
  EXPECT_EQ(live.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(live.message(), HasSubstr("cancel it first"));
  EXPECT_EQ(Listed(), 1);

  ASSERT_TRUE(c_->CancelJob(*id).ok());
  ASSERT_TRUE(c_->DeleteJob(*id).ok());
  EXPECT_EQ(c_->GetJob(*id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Listed(), 0);
  EXPECT_FALSE(std::filesystem::exists(LogDir(*id)));
  EXPECT_EQ(c_->DeleteJob(*id).code(), StatusCode::kNotFound);
  // A late chunk of its log is accepted and dropped: the log does not come back.
  EXPECT_TRUE(c_->AppendLogs(log).ok());
  EXPECT_FALSE(std::filesystem::exists(LogDir(*id)));

  Reopen();  // the deletion is in the state store, not only in memory
  EXPECT_EQ(c_->GetJob(*id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Listed(), 0);
}

TEST_F(CoordinatorLimitsTest, RetentionDeletesFinishedJobsOnTickAfterTheirTime) {
  options_.job_retention_ms = 3'600'000;
  Reopen();
  auto finished = Submit();
  auto pending = Submit();
  ASSERT_TRUE(finished.ok() && pending.ok());
  ASSERT_TRUE(c_->CancelJob(*finished).ok());
  c_->Tick();
  clock_.AdvanceMs(3'600'000 - 1);
  c_->Tick();
  EXPECT_TRUE(c_->GetJob(*finished).ok()) << "deleted before its retention was over";
  clock_.AdvanceMs(60'000);  // past the retention, and past the next retention check
  c_->Tick();
  EXPECT_EQ(c_->GetJob(*finished).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(c_->GetJob(*pending).ok()) << "a job that has not finished never expires";
  ASSERT_TRUE(c_->Flush().ok());
  Reopen();
  EXPECT_EQ(c_->GetJob(*finished).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(c_->GetJob(*pending).ok());
}

TEST_F(CoordinatorLimitsTest, RetentionZeroKeepsEveryJob) {
  auto id = Submit();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(c_->CancelJob(*id).ok());
  clock_.AdvanceMs(int64_t{400} * 86'400'000);
  c_->Tick();
  EXPECT_TRUE(c_->GetJob(*id).ok());
}

TEST_F(CoordinatorLimitsTest, SubmitWithTheSameRequestIdMakesOneJobAlsoAfterARestart) {
  auto first = Submit("ann@h", "req-1");
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = Submit("ann@h", "req-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);
  EXPECT_EQ(Listed(), 1);
  Reopen();
  auto after_restart = Submit("ann@h", "req-1");
  ASSERT_TRUE(after_restart.ok()) << after_restart.status();
  EXPECT_EQ(*after_restart, *first);
  auto other = Submit("ann@h", "req-2");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *first);
  EXPECT_EQ(Listed(), 2);
}

TEST_F(CoordinatorLimitsTest, PendingJobsPerSubmitterAreLimited) {
  options_.max_pending_per_submitter = 2;
  Reopen();
  auto a1 = Submit("ann@h");
  ASSERT_TRUE(a1.ok());
  ASSERT_TRUE(Submit("ann@h").ok());
  auto refused = Submit("ann@h");
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("ann@h has 2 jobs pending"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-pending-per-submitter 2"));
  EXPECT_TRUE(Submit("bob@h").ok()) << "another submitter has a limit of its own";
  ASSERT_TRUE(c_->CancelJob(*a1).ok());
  EXPECT_TRUE(Submit("ann@h").ok()) << "a cancelled job is no longer pending";
  // A job that started is no longer pending either.
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 4)).ok());
  c_->Tick();
  EXPECT_TRUE(Submit("ann@h").ok());
}

TEST_F(CoordinatorLimitsTest, OversizedNamesAndChunksAreRefusedNamingTheLimit) {
  std::string yaml = SpecYaml(1, 1);
  yaml.replace(yaml.find("name: t"), 7, "name: " + std::string(129, 'n'));
  auto long_name = Submit("", "", yaml);
  ASSERT_EQ(long_name.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(long_name.status().message(),
              HasSubstr("name (line 1): is 129 characters long; must be at most 128"));
  auto long_request_id = Submit("", std::string(200, 'r'));
  EXPECT_EQ(long_request_id.status().code(), StatusCode::kInvalidArgument);

  auto node = c_->Register(RegisterReq(std::string(129, 'w'), 1));
  ASSERT_EQ(node.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(node.status().message(), HasSubstr("node name is 129 bytes; at most 128"));
  EXPECT_EQ(c_->ListWorkers().workers_size(), 0);

  auto id = Submit();
  ASSERT_TRUE(id.ok());
  v1::AppendLogsRequest log;
  log.set_job_id(*id);
  log.set_data(std::string(kMaxLogChunkBytes + 1, 'x'));
  Status big = c_->AppendLogs(log);
  ASSERT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("at most 1048576"));
}

TEST_F(CoordinatorLimitsTest, WorkersListOnlyLiveTrainersUnlessAskedForHistory) {
  ASSERT_TRUE(c_->Register(RegisterReq("n1", 2)).ok());
  v1::HeartbeatRequest hb;
  hb.set_name("n1");
  hb.set_agent_id("agent-1");
  *hb.add_trainers() = Trainer("live", 1, 0);
  *hb.add_trainers() = Exited("old", 1, 0, 0);
  c_->Heartbeat(hb);
  v1::ListWorkersResponse now = c_->ListWorkers();
  ASSERT_EQ(now.workers_size(), 1);
  ASSERT_EQ(now.workers(0).trainers_size(), 1);
  EXPECT_EQ(now.workers(0).trainers(0).job_id(), "live");
  v1::ListWorkersRequest all;
  all.set_include_exited(true);
  EXPECT_EQ(c_->ListWorkers(all).workers(0).trainers_size(), 2);
  // A dead node runs nothing anyone can see.
  clock_.AdvanceMs(options_.heartbeat_timeout_ms + 1);
  c_->Tick();
  EXPECT_EQ(c_->ListWorkers().workers(0).trainers_size(), 0);
}

}  // namespace
}  // namespace drover::coordinator
