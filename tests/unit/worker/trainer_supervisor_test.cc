#include "worker/trainer_supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/exit_codes.h"

namespace drover {
namespace {

class TrainerSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("drover_sup_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    supervisor_ = std::make_unique<TrainerSupervisor>(SystemClock::Get(),
                                                      [this](const v1::TrainerStatus& st) {
                                                        std::lock_guard<std::mutex> l(mu_);
                                                        exits_.push_back(st);
                                                      });
  }
  void TearDown() override {
    supervisor_.reset();
    std::filesystem::remove_all(dir_);
  }

  TrainerLaunch Shell(const std::string& script, int rank = 0, int64_t attempt = 1) {
    TrainerLaunch l;
    l.key = TrainerKey{"j-1", attempt, rank};
    l.spawn.executable = "/bin/sh";
    l.spawn.args = {"-c", script};
    l.spawn.env = {{"DROVER_TEST_VAR", "hello-env"}};
    l.spawn.log_path = LogPath(rank, attempt);
    return l;
  }
  std::string LogPath(int rank, int64_t attempt = 1) {
    return (dir_ / ("a" + std::to_string(attempt)) / ("rank-" + std::to_string(rank) + ".log"))
        .string();
  }
  std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // Waits (bounded) for `n` exit callbacks.
  std::vector<v1::TrainerStatus> WaitExits(size_t n, int timeout_ms = 5000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (exits_.size() >= n) return exits_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::lock_guard<std::mutex> l(mu_);
    return exits_;
  }

  std::filesystem::path dir_;
  std::mutex mu_;
  std::vector<v1::TrainerStatus> exits_;
  std::unique_ptr<TrainerSupervisor> supervisor_;
};

TEST_F(TrainerSupervisorTest, ReportsExitCodeAndCapturesStdoutStderrAndEnv) {
  ASSERT_TRUE(supervisor_->Start(Shell("echo out-$DROVER_TEST_VAR; echo err >&2; exit 7")).ok());
  auto exits = WaitExits(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].state(), v1::TRAINER_EXITED);
  EXPECT_EQ(exits[0].exit_code(), 7);
  EXPECT_EQ(exits[0].signal(), 0);
  EXPECT_GT(exits[0].pid(), 0);
  EXPECT_EQ(ReadFile(LogPath(0)), "out-hello-env\nerr\n");
}

TEST_F(TrainerSupervisorTest, FailedExitCarriesTheLastLogLineSuccessNone) {
  ASSERT_TRUE(
      supervisor_->Start(Shell("echo step 1; echo 'E trainer: NOT_FOUND: no shard' >&2; exit 2"))
          .ok());
  ASSERT_TRUE(supervisor_->Start(Shell("echo all good", /*rank=*/1)).ok());
  auto exits = WaitExits(2);
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& e : exits) {
    EXPECT_EQ(e.last_error(), e.rank() == 0 ? "E trainer: NOT_FOUND: no shard" : "") << e.rank();
  }
}

TEST_F(TrainerSupervisorTest, ReportsTerminatingSignal) {
  ASSERT_TRUE(supervisor_->Start(Shell("kill -9 $$")).ok());
  auto exits = WaitExits(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal(), SIGKILL);
}

TEST_F(TrainerSupervisorTest, ExecFailureIsAnExit127WithTheReasonInTheLog) {
  TrainerLaunch l = Shell("");
  l.spawn.executable = (dir_ / "no-such-trainer").string();
  ASSERT_TRUE(supervisor_->Start(l).ok());
  auto exits = WaitExits(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit_code(), 127);
  EXPECT_NE(ReadFile(LogPath(0)).find("no-such-trainer"), std::string::npos);
}

// The node shutting down: a trainer that drains on SIGUSR2 exits by itself, one that does not
// is killed at the end of the grace period, and a trainer started after is not started: it
// exits kExitDrained at once, saying why, so its job restarts elsewhere.
TEST_F(TrainerSupervisorTest, DrainAllAsksEachTrainerToDrainKillsTheLateAndStartsNoMore) {
  const std::string ready = (dir_ / "ready").string();
  ASSERT_TRUE(supervisor_
                  ->Start(Shell("trap 'echo drained; exit 75' USR2; touch " + ready +
                                "0; while true; do sleep 0.02; done"))
                  .ok());
  ASSERT_TRUE(
      supervisor_->Start(Shell("trap '' USR2; touch " + ready + "1; exec sleep 30", /*rank=*/1))
          .ok());
  for (int i = 0;
       i < 1000 && !(std::filesystem::exists(ready + "0") && std::filesystem::exists(ready + "1"));
       ++i) {
    usleep(5000);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(supervisor_->DrainAll(/*grace_ms=*/500), 2);
  auto exits = WaitExits(2);
  ASSERT_EQ(exits.size(), 2u);
  for (const auto& e : exits) {
    if (e.rank() == 0) {
      EXPECT_EQ(e.exit_code(), kExitDrained);
      EXPECT_EQ(e.last_error(), "drained");
    } else {
      EXPECT_EQ(e.signal(), SIGKILL) << "ignored the drain: killed after the grace period";
      EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(450));
    }
  }
  ASSERT_TRUE(supervisor_->Start(Shell("echo should not run", /*rank=*/2)).ok());
  exits = WaitExits(3);
  ASSERT_EQ(exits.size(), 3u);
  EXPECT_EQ(exits[2].rank(), 2);
  EXPECT_EQ(exits[2].exit_code(), kExitDrained);
  EXPECT_EQ(exits[2].last_error(),
            "not started: the node is shutting down (its agent is draining its trainers)");
  EXPECT_EQ(ReadFile(LogPath(2)).find("should not run"), std::string::npos);
}

// An operator's drain (DrainTrainersOrder): each live trainer is asked once, however often
// the order comes, and the node goes on taking starts (the coordinator places nothing new on
// a drained node; one it ordered before the drain is drained by the next order).
TEST_F(TrainerSupervisorTest, DrainRunningAsksEachTrainerOnceAndLaterStartsRun) {
  const std::string ready = (dir_ / "ready").string();
  const std::string count = (dir_ / "usr2").string();
  ASSERT_TRUE(supervisor_
                  ->Start(Shell("trap 'echo x >> " + count + "' USR2; touch " + ready +
                                "; while true; do sleep 0.02; done"))
                  .ok());
  for (int i = 0; i < 1000 && !std::filesystem::exists(ready); ++i) usleep(5000);
  EXPECT_EQ(supervisor_->DrainRunning(/*grace_ms=*/400), 1);
  EXPECT_EQ(supervisor_->DrainRunning(/*grace_ms=*/400), 0) << "asked already";
  auto exits = WaitExits(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal(), SIGKILL) << "still running after the grace period";
  EXPECT_EQ(ReadFile(count), "x\n") << "one SIGUSR2";
  ASSERT_TRUE(supervisor_->Start(Shell("echo ran; exit 0", /*rank=*/1)).ok());
  exits = WaitExits(2);
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_EQ(exits[1].exit_code(), 0);
  EXPECT_NE(ReadFile(LogPath(1)).find("ran"), std::string::npos);
}

TEST_F(TrainerSupervisorTest, StopSendsSigtermToTheWholeGroup) {
  // The child shell starts a grandchild; both must go.
  ASSERT_TRUE(
      supervisor_->Start(Shell("sleep 30 & echo $! > " + (dir_ / "gc").string() + "; wait")).ok());
  std::string gc_file = (dir_ / "gc").string();
  for (int i = 0; i < 500 && ReadFile(gc_file).empty(); ++i) usleep(5000);
  pid_t grandchild = std::stoi(ReadFile(gc_file));
  supervisor_->Stop("j-1", 1, 5000);
  auto exits = WaitExits(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal(), SIGTERM);
  // The grandchild was signalled with its group (and killed with it after the leader went).
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = kill(grandchild, 0) != 0;
    if (!gone) usleep(5000);
  }
  EXPECT_TRUE(gone);
}

TEST_F(TrainerSupervisorTest, SigtermIgnoredEscalatesToSigkillAfterGrace) {
  ASSERT_TRUE(
      supervisor_->Start(Shell("trap '' TERM; echo ready; while :; do sleep 0.05; done")).ok());
  for (int i = 0; i < 500 && ReadFile(LogPath(0)).empty(); ++i) usleep(5000);
  auto t0 = std::chrono::steady_clock::now();
  supervisor_->Stop("j-1", 1, 300);
  supervisor_->Stop("j-1", 1, 60000);  // a repeated stop never extends the deadline
  auto exits = WaitExits(1);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal(), SIGKILL);
  EXPECT_GE(ms, 290);
}

TEST_F(TrainerSupervisorTest, StopOnlyTouchesOlderOrEqualAttemptsOfThatJob) {
  ASSERT_TRUE(supervisor_->Start(Shell("sleep 30", 0, 1)).ok());
  ASSERT_TRUE(supervisor_->Start(Shell("sleep 30", 0, 2)).ok());
  TrainerLaunch other = Shell("sleep 30", 0, 1);
  other.key.job_id = "j-other";
  other.spawn.log_path = (dir_ / "other.log").string();
  ASSERT_TRUE(supervisor_->Start(other).ok());
  supervisor_->Stop("j-1", 1, 0);
  auto exits = WaitExits(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].attempt(), 1);
  EXPECT_EQ(exits[0].job_id(), "j-1");
  EXPECT_EQ(supervisor_->RunningCount(), 2);
}

// SIGUSR1 once per request id to each live trainer of that attempt; a program that takes no
// interest in it is not killed (it starts blocked: worker/process.h). Not a shell: sh
// unblocks every signal when it starts.
TEST_F(TrainerSupervisorTest, ACheckpointRequestSignalsEachTrainerOfTheAttemptOnce) {
  auto sleeper = [this](int rank, int64_t attempt) {
    TrainerLaunch l = Shell("", rank, attempt);
    l.spawn.executable = "/bin/sleep";
    l.spawn.args = {"30"};
    return l;
  };
  ASSERT_TRUE(supervisor_->Start(sleeper(0, 1)).ok());
  ASSERT_TRUE(supervisor_->Start(sleeper(1, 1)).ok());
  ASSERT_TRUE(supervisor_->Start(sleeper(0, 2)).ok());
  EXPECT_EQ(supervisor_->RequestCheckpoint("j-1", 1, 7), 2);
  EXPECT_EQ(supervisor_->RequestCheckpoint("j-1", 1, 7), 0);  // a repeated order
  EXPECT_EQ(supervisor_->RequestCheckpoint("j-1", 1, 8), 2);
  EXPECT_EQ(supervisor_->RequestCheckpoint("j-1", 2, 8), 1);
  EXPECT_EQ(supervisor_->RequestCheckpoint("j-other", 1, 9), 0);
  supervisor_->Stop("j-1", 1, 30000);
  EXPECT_EQ(supervisor_->RequestCheckpoint("j-1", 1, 10), 0);  // stopping
  auto exits = WaitExits(2);
  ASSERT_EQ(exits.size(), 2u);
  for (const v1::TrainerStatus& exit : exits) {
    EXPECT_EQ(exit.attempt(), 1);
    EXPECT_EQ(exit.signal(), SIGTERM) << "rank " << exit.rank();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(WaitExits(3, 0).size(), 2u);
  EXPECT_EQ(supervisor_->RunningCount(), 1);  // attempt 2's, alive after its SIGUSR1
}

TEST_F(TrainerSupervisorTest, RepeatedStartIsIgnored) {
  ASSERT_TRUE(supervisor_->Start(Shell("echo once; sleep 30")).ok());
  ASSERT_TRUE(supervisor_->Start(Shell("echo twice; sleep 30")).ok());
  EXPECT_EQ(supervisor_->RunningCount(), 1);
  EXPECT_EQ(supervisor_->Snapshot().size(), 1u);
}

TEST_F(TrainerSupervisorTest, StatusChannelReportsAreFoldedInBeforeTheExit) {
  ASSERT_TRUE(supervisor_
                  ->Start(Shell("echo '{\"progress\":{\"step\":\"4\",\"loss\":1.5}}' "
                                ">&$DROVER_STATUS_FD; "
                                "echo '{\"checkpoint\":{\"step\":\"4\",\"path\":\"/p\"}}' "
                                ">&$DROVER_STATUS_FD; exit 0"))
                  .ok());
  auto exits = WaitExits(1);
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].progress().step(), 4);
  EXPECT_EQ(exits[0].progress().last_checkpoint_step(), 4);
  auto ckpts = supervisor_->PendingCheckpoints();
  ASSERT_EQ(ckpts.size(), 1u);
  EXPECT_EQ(ckpts[0].job_id(), "j-1");
  supervisor_->AckCheckpoints(1);
  EXPECT_TRUE(supervisor_->PendingCheckpoints().empty());
  // The exited trainer stays visible for heartbeats.
  auto snap = supervisor_->Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].state(), v1::TRAINER_EXITED);
}

// A checkpoint record is handed on as it arrives, while the trainer runs on (the agent
// heartbeats at once with it); progress alone calls nothing.
TEST_F(TrainerSupervisorTest, ACheckpointRecordIsSignalledAsItArrives) {
  supervisor_.reset();
  std::atomic<int> calls{0};
  supervisor_ = std::make_unique<TrainerSupervisor>(SystemClock::Get(), nullptr, 60000,
                                                    [&calls] { ++calls; });
  ASSERT_TRUE(supervisor_
                  ->Start(Shell("echo '{\"progress\":{\"step\":\"4\",\"loss\":1.5}}' "
                                ">&$DROVER_STATUS_FD; sleep 0.3; "
                                "echo '{\"checkpoint\":{\"step\":\"4\",\"path\":\"/p\"}}' "
                                ">&$DROVER_STATUS_FD; sleep 30"))
                  .ok());
  for (int i = 0; i < 2000 && calls.load() == 0; ++i) usleep(5000);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(supervisor_->RunningCount(), 1);
  ASSERT_EQ(supervisor_->PendingCheckpoints().size(), 1u);
  EXPECT_EQ(supervisor_->PendingCheckpoints()[0].step(), 4);
  supervisor_->StopAll(0);
}

TEST_F(TrainerSupervisorTest, ExitedTrainersAreForgottenAfterRetention) {
  supervisor_.reset();
  supervisor_ = std::make_unique<TrainerSupervisor>(SystemClock::Get(), nullptr,
                                                    /*exited_retention_ms=*/50);
  ASSERT_TRUE(supervisor_->Start(Shell("exit 0")).ok());
  bool forgotten = false;
  for (int i = 0; i < 400 && !forgotten; ++i) {
    forgotten = supervisor_->Snapshot().empty();
    if (!forgotten) usleep(5000);
  }
  EXPECT_TRUE(forgotten);
}

}  // namespace
}  // namespace drover
