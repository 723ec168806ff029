// The agent against an in-process fake coordinator (a WorkerService that records what it
// gets and hands out scripted orders). Trainers are small shell scripts.
#include "worker/agent.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace drover {
namespace {

class FakeCoordinator final : public v1::WorkerService::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    std::lock_guard<std::mutex> l(mu);
    registers.push_back(*req);
    resp->set_heartbeat_interval_ms(50);
    resp->set_heartbeat_timeout_ms(500);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override {
    std::lock_guard<std::mutex> l(mu);
    heartbeats.push_back(*req);
    if (!orders.empty()) {
      *resp->add_orders() = orders.front();
      orders.pop_front();
    }
    if (reregister_once) {
      resp->set_reregister(true);
      reregister_once = false;
    }
    return grpc::Status::OK;
  }
  grpc::Status ReportTrainerExit(grpc::ServerContext*, const v1::TrainerExitRequest* req,
                                 v1::TrainerExitResponse*) override {
    std::lock_guard<std::mutex> l(mu);
    exits.push_back(*req);
    return grpc::Status::OK;
  }
  grpc::Status AppendLogs(grpc::ServerContext*, const v1::AppendLogsRequest* req,
                          v1::AppendLogsResponse*) override {
    std::lock_guard<std::mutex> l(mu);
    logs += req->data();
    return grpc::Status::OK;
  }

  std::mutex mu;
  std::vector<v1::RegisterRequest> registers;
  std::vector<v1::HeartbeatRequest> heartbeats;
  std::vector<v1::TrainerExitRequest> exits;
  std::deque<v1::Order> orders;
  std::string logs;
  bool reregister_once = false;
};

bool WaitFor(const std::function<bool()>& cond, int timeout_ms = 5000) {
  for (int waited = 0; waited < timeout_ms; waited += 5) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("drover_agent_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (agent_) agent_->Shutdown();
    if (run_.joinable()) run_.join();
    agent_.reset();
    server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  std::string Script(const std::string& body) {
    std::string path = (dir_ / "trainer.sh").string();
    // bash, not sh: dash cannot redirect to the fds above 9 the status socket may get.
    std::ofstream(path) << "#!/bin/bash\n" << body << "\n";
    chmod(path.c_str(), 0755);
    return path;
  }
  void StartAgent(const std::string& trainer) {
    AgentOptions o;
    o.coordinator = "127.0.0.1:" + std::to_string(port_);
    o.name = "n1";
    o.slots = 2;
    o.work_dir = (dir_ / "work").string();
    o.trainer_path = trainer;
    o.shutdown_grace_ms = 200;
    agent_ = std::make_unique<Agent>(o);
    run_ = std::thread([this] { EXPECT_TRUE(agent_->Run().ok()); });
  }
  v1::Order StartOrder(int rank) {
    v1::Order o;
    v1::StartTrainerOrder* s = o.mutable_start();
    s->set_job_id("j-7");
    s->set_attempt(3);
    s->set_rank(rank);
    s->set_world_size(2);
    s->set_slot(rank);
    s->set_spec_yaml("name: seven\n");
    return o;
  }
  template <typename T>
  size_t Count(const std::vector<T>& v) {
    std::lock_guard<std::mutex> l(fake_.mu);
    return v.size();
  }

  std::filesystem::path dir_;
  FakeCoordinator fake_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Agent> agent_;
  std::thread run_;
};

TEST_F(AgentTest, RegistersSlotsThenStartsTrainerAndReportsItsExitAtOnce) {
  StartAgent(
      Script("echo \"rank $DROVER_RANK of $DROVER_WORLD_SIZE attempt $DROVER_ATTEMPT\"; "
             "echo \"rendezvous $DROVER_COORDINATOR\"; cat \"$DROVER_SPEC\"; exit 5"));
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.registers) >= 1; }));
  {
    std::lock_guard<std::mutex> l(fake_.mu);
    const v1::RegisterRequest& r = fake_.registers[0];
    EXPECT_EQ(r.name(), "n1");
    EXPECT_EQ(r.slots_size(), 2);
    EXPECT_EQ(r.slots(1).index(), 1);
    EXPECT_EQ(r.slots(0).device(), v1::CPU);
    EXPECT_FALSE(r.agent_id().empty());
    fake_.orders.push_back(StartOrder(1));
    fake_.orders.push_back(StartOrder(1));  // a repeated order must not start a second one
  }
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.exits) >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::lock_guard<std::mutex> l(fake_.mu);
  ASSERT_EQ(fake_.exits.size(), 1u);
  const v1::TrainerStatus& t = fake_.exits[0].trainer();
  EXPECT_EQ(t.job_id(), "j-7");
  EXPECT_EQ(t.attempt(), 3);
  EXPECT_EQ(t.rank(), 1);
  EXPECT_EQ(t.exit_code(), 5);
  EXPECT_EQ(t.state(), v1::TRAINER_EXITED);
  const std::string log_path = (dir_ / "work/logs/j-7/attempt-3/rank-1.log").string();
  std::ifstream in(log_path);
  std::stringstream ss;
  ss << in.rdbuf();
  // The order named no rendezvous address (a coordinator on a wildcard address): the
  // trainer dials the coordinator the way this agent does.
  EXPECT_EQ(ss.str(), "rank 1 of 2 attempt 3\nrendezvous 127.0.0.1:" + std::to_string(port_) +
                          "\nname: seven\n");
  // The exited trainer stays in heartbeats.
  ASSERT_FALSE(fake_.heartbeats.empty());
}

// After a trainer exit the coordinator is about to place the job's next attempt: the agent
// heartbeats every 100 ms for a while so that its orders do not wait a whole period. And
// each trainer gets its lease validity, 2/3 of the coordinator's node timeout.
TEST_F(AgentTest, TrainerExitBringsFastHeartbeatsAndTrainersGetTheirLease) {
  AgentOptions o;
  o.coordinator = "127.0.0.1:" + std::to_string(port_);
  o.name = "n1";
  o.slots = 1;
  o.work_dir = (dir_ / "work").string();
  o.trainer_path = Script("echo \"lease $DROVER_LEASE_MS\"; sleep 0.3; exit 1");
  o.heartbeat_interval_ms = 2000;  // slow: only an exit explains quick heartbeats
  agent_ = std::make_unique<Agent>(o);
  run_ = std::thread([this] { EXPECT_TRUE(agent_->Run().ok()); });
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.heartbeats) >= 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard<std::mutex> l(fake_.mu);
    fake_.orders.push_back(StartOrder(0));
  }
  // The order rides the next heartbeat (2 s away): wait for it, then count after the exit.
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.exits) >= 1; }, 10000));
  const size_t at_exit = Count(fake_.heartbeats);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_GE(Count(fake_.heartbeats), at_exit + 5);
  std::ifstream in(dir_ / "work/logs/j-7/attempt-3/rank-0.log");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "lease 333");
}

TEST_F(AgentTest, StopOrderEndsTrainerAndReregisterListsWhatRuns) {
  StartAgent(Script("exec sleep 30"));
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.registers) >= 1; }));
  {
    std::lock_guard<std::mutex> l(fake_.mu);
    fake_.orders.push_back(StartOrder(0));
  }
  // Wait until a heartbeat lists the running trainer, then ask for a re-registration.
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> l(fake_.mu);
    return !fake_.heartbeats.empty() && fake_.heartbeats.back().trainers_size() == 1;
  }));
  {
    std::lock_guard<std::mutex> l(fake_.mu);
    fake_.reregister_once = true;
  }
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.registers) >= 2; }));
  {
    std::lock_guard<std::mutex> l(fake_.mu);
    ASSERT_EQ(fake_.registers[1].running_size(), 1);
    EXPECT_EQ(fake_.registers[1].running(0).job_id(), "j-7");
    v1::Order stop;
    stop.mutable_stop()->set_job_id("j-7");
    stop.mutable_stop()->set_attempt(3);
    stop.mutable_stop()->set_grace_ms(1000);
    fake_.orders.push_back(stop);
  }
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.exits) >= 1; }));
  std::lock_guard<std::mutex> l(fake_.mu);
  EXPECT_EQ(fake_.exits[0].trainer().signal(), SIGTERM);
}

TEST_F(AgentTest, CheckpointRecordsRideHeartbeatsUntilOneSucceeds) {
  StartAgent(Script(
      "echo '{\"checkpoint\":{\"step\":\"10\",\"path\":\"/c/step_10\"}}' >&$DROVER_STATUS_FD; "
      "exec sleep 30"));
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.registers) >= 1; }));
  {
    std::lock_guard<std::mutex> l(fake_.mu);
    fake_.orders.push_back(StartOrder(0));
  }
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> l(fake_.mu);
    for (const auto& hb : fake_.heartbeats) {
      if (hb.checkpoints_size() > 0) return true;
    }
    return false;
  }));
  const size_t seen = Count(fake_.heartbeats);
  ASSERT_TRUE(WaitFor([&] { return Count(fake_.heartbeats) >= seen + 3; }));
  std::lock_guard<std::mutex> l(fake_.mu);
  int carrying = 0;
  for (const auto& hb : fake_.heartbeats) {
    if (hb.checkpoints_size() > 0) {
      ++carrying;
      EXPECT_EQ(hb.checkpoints(0).job_id(), "j-7");
      EXPECT_EQ(hb.checkpoints(0).attempt(), 3);
      EXPECT_EQ(hb.checkpoints(0).step(), 10);
    }
  }
  EXPECT_EQ(carrying, 1);  // acknowledged by the first successful heartbeat
}

}  // namespace
}  // namespace drover
