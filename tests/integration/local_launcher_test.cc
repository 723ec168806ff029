// `drover train --nproc N` (cli/local_launcher.cc): N trainer processes with a local
// rendezvous store. The mechanics (prefixed output, stopping, exit codes) run on the real
// trainer where it can show them and on the scripted trainer (tests/tools/fake_trainer.cc,
// through the hidden --trainer option) where a rank must misbehave on cue. The parallel
// modes themselves are pinned in parallel_train_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/exit_codes.h"
#include "tests/integration/train_process.h"

namespace drover {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kFakeTrainer = kBin + "drover-fake-trainer";

class LocalLauncherTest : public TrainProcessFixture {
 protected:
  // `drover train spec --nproc n` on the scripted trainer, scripted by `env`. A micro-batch
  // of 1 lets WriteSpec's global batch of 4 fit n = 2 and 4.
  pid_t SpawnFake(const std::string& spec, int n, const std::vector<std::string>& env) {
    return Spawn({kBin + "drover", "train", spec, "--nproc", std::to_string(n), "--set",
                  "train.micro_batch=1", "--trainer", kFakeTrainer},
                 env);
  }

  // The pid the scripted trainer of `rank` printed when it started; -1 when it did not.
  pid_t RankPid(int rank) const {
    const std::regex started("\\[rank " + std::to_string(rank) + "\\] fake-trainer .* pid (\\d+)");
    std::smatch m;
    const std::string log = Log();
    return std::regex_search(log, m, started) ? std::stoi(m[1]) : -1;
  }

  // Waits up to `timeout_s` for every rank in [0, n) to have started.
  bool WaitForRanks(int n, int timeout_s) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      bool all = true;
      for (int r = 0; r < n; ++r) all = all && RankPid(r) > 0;
      if (all) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  static bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

  static double SecondsSince(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

TEST_F(LocalLauncherTest, RealTrainerRanksTrainWithPrefixedOutput) {
  const std::string spec = WriteSpec(4, 0);
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--nproc", "2", "--set",
                        "train.micro_batch=2", "--threads", "1"})),
            0)
      << Log();
  const std::string log = Log();
  EXPECT_THAT(log, HasSubstr("[rank 0] "));
  EXPECT_THAT(log, HasSubstr("[rank 1] "));
  EXPECT_THAT(log, HasSubstr("all 2 ranks finished"));
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("drover train: ", 0) == 0) continue;  // the launcher's own
    EXPECT_THAT(line, ContainsRegex("^\\[rank [01]\\] ")) << log;
  }
  EXPECT_EQ(MetricsLines().size(), 4u);  // rank 0 only
}

// SIGUSR1 to the launcher reaches every rank, which save a checkpoint at once (the interval,
// 100000 steps, is never reached), and training goes on.
TEST_F(LocalLauncherTest, RealTrainerRanksSaveACheckpointWhenTheLauncherGetsSigusr1) {
  const std::string spec = WriteSpec(1000000, 100000);
  const pid_t pid = Spawn({kBin + "drover", "train", spec, "--nproc", "2", "--set",
                           "train.micro_batch=2", "--threads", "1"});
  auto wait_for = [](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  };
  ASSERT_TRUE(wait_for([&] { return MetricsLines().size() >= 2; })) << Log();
  const fs::path ckpt = dir_ / "out" / "ckpt";
  auto saved = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpt, ec)) {
      if (e.path().filename().string().rfind("step_", 0) == 0 &&
          fs::exists(e.path() / "manifest.json")) {
        return true;
      }
    }
    return false;
  };
  EXPECT_FALSE(saved());
  ASSERT_EQ(kill(pid, SIGUSR1), 0);
  ASSERT_TRUE(wait_for(saved)) << Log();
  const size_t lines = MetricsLines().size();
  EXPECT_TRUE(wait_for([&] { return MetricsLines().size() > lines + 2; })) << Log();
  kill(pid, SIGTERM);
  EXPECT_EQ(Wait(pid), 1) << Log();
  EXPECT_THAT(Log(), HasSubstr("SIGUSR1: asked 2 ranks for a checkpoint"));
  EXPECT_THAT(Log(), ContainsRegex("\\[rank 0\\] .*saving a checkpoint at step [0-9]+: requested"));
}

// SIGUSR2 to the launcher drains every rank: they save the checkpoint of the step they
// agree on (no periodic one is due), stop once it is committed, and `drover train` exits 75
// (kExitDrained), as before a Slurm time limit (`--signal=USR2@120`).
TEST_F(LocalLauncherTest, RealTrainerRanksSaveACheckpointAndStopWhenTheLauncherGetsSigusr2) {
  const std::string spec = WriteSpec(1000000, 100000);
  const pid_t pid = Spawn({kBin + "drover", "train", spec, "--nproc", "2", "--set",
                           "train.micro_batch=2", "--threads", "1"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (MetricsLines().size() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(MetricsLines().size(), 3u) << Log();
  const size_t trained = MetricsLines().size();
  ASSERT_EQ(kill(pid, SIGUSR2), 0);
  EXPECT_EQ(Wait(pid), kExitDrained) << Log();
  EXPECT_THAT(Log(), HasSubstr("SIGUSR2: draining 2 ranks"));
  EXPECT_THAT(Log(), HasSubstr("drained (SIGUSR2): the ranks saved the checkpoint"));
  int64_t newest = -1;
  for (const auto& e : fs::directory_iterator(dir_ / "out" / "ckpt")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos &&
        fs::exists(e.path() / "manifest.json")) {
      newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
    }
  }
  EXPECT_GE(newest, static_cast<int64_t>(trained)) << Log();
  EXPECT_EQ(static_cast<int64_t>(MetricsLines().size()), newest) << "a step trained after it";
}

TEST_F(LocalLauncherTest, FailingRealTrainerRankExitsWithItsCode) {
  // A missing train.init_from fails every rank at start-up: input the user must fix.
  const std::string spec = WriteSpec(4, 0, /*n_embd=*/32);
  EXPECT_EQ(
      Wait(Spawn({kBin + "drover", "train", spec, "--nproc", "2", "--set", "train.micro_batch=2",
                  "--set", "train.init_from=/nonexistent/model.bin", "--threads", "1"})),
      2)
      << Log();
  EXPECT_THAT(Log(), ContainsRegex("rank [01] failed with exit code 2"));
  EXPECT_THAT(Log(), HasSubstr("train.init_from"));
}

TEST_F(LocalLauncherTest, LayoutThatDoesNotFitNprocExitsTwoNamingTheFactorAndStartsNothing) {
  if (!fs::exists(kFakeTrainer)) GTEST_SKIP() << kFakeTrainer << " is not built";
  const std::string spec = WriteSpec(4, 0);  // n_layer 2, global_batch 4, micro_batch 4
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--nproc", "4", "--set", "parallel.pp=4",
                        "--trainer", kFakeTrainer})),
            2);
  EXPECT_THAT(Log(), HasSubstr("parallel.pp (from --set): 4 does not divide model.n_layer (2)"));
  EXPECT_EQ(Wait(Spawn({kBin + "drover", "train", spec, "--nproc", "3", "--set",
                        "train.micro_batch=1", "--trainer", kFakeTrainer})),
            2);
  EXPECT_THAT(Log(), HasSubstr("train.global_batch (4) is not divisible by dp (3)"));
  EXPECT_THAT(Log(), Not(HasSubstr("[rank")));
  EXPECT_THAT(Log(), Not(HasSubstr("starting")));
}

TEST_F(LocalLauncherTest, EveryRankFinishingExitsZeroWithTheEnvironmentContract) {
  if (!fs::exists(kFakeTrainer)) GTEST_SKIP() << kFakeTrainer << " is not built";
  const std::string spec = WriteSpec(3, 0);
  ASSERT_EQ(Wait(SpawnFake(spec, 2, {"DROVER_FAKE_STEP_MS=10"})), 0) << Log();
  const std::string log = Log();
  EXPECT_THAT(log, HasSubstr("[rank 0] fake-trainer job local-"));
  EXPECT_THAT(log, HasSubstr("attempt 1 rank 0/2"));
  EXPECT_THAT(log, HasSubstr("attempt 1 rank 1/2"));
  EXPECT_THAT(log, HasSubstr("[rank 0] fake-trainer: done after step 3"));
  EXPECT_THAT(log, HasSubstr("[rank 1] fake-trainer: done after step 3"));
  EXPECT_THAT(log, HasSubstr("all 2 ranks finished"));
}

TEST_F(LocalLauncherTest, FailingRankStopsTheOthersPromptly) {
  if (!fs::exists(kFakeTrainer)) GTEST_SKIP() << kFakeTrainer << " is not built";
  const std::string spec = WriteSpec(3, 0);
  // Rank 0 hangs in its first step for good; rank 1 exits 1 after one 2 s step, time
  // enough for rank 0 to be under way however loaded the machine.
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = Wait(SpawnFake(spec, 2,
                                {"DROVER_FAKE_STEP_MS=2000", "DROVER_FAKE_HANG_AT_STEP=1",
                                 "DROVER_FAKE_HANG_RANK=0", "DROVER_FAKE_CRASH_AT_STEP=2",
                                 "DROVER_FAKE_CRASH_RANK=1", "DROVER_FAKE_CRASH_MODE=exit:1"}));
  const double elapsed_s = SecondsSince(t0);
  EXPECT_EQ(rc, 1) << Log();
  EXPECT_LT(elapsed_s, 10.0) << Log();
  EXPECT_THAT(Log(), HasSubstr("[rank 0] fake-trainer: hanging at step 1"));
  EXPECT_THAT(Log(), HasSubstr("[rank 1] fake-trainer: crashing at step 2"));
  EXPECT_THAT(Log(), HasSubstr("rank 1 failed with exit code 1"));
  const pid_t rank0 = RankPid(0);
  ASSERT_GT(rank0, 0) << Log();
  EXPECT_TRUE(Gone(rank0)) << "rank 0 (pid " << rank0 << ") outlived the launcher";
}

TEST_F(LocalLauncherTest, SigtermToTheLauncherStopsEveryRank) {
  if (!fs::exists(kFakeTrainer)) GTEST_SKIP() << kFakeTrainer << " is not built";
  const std::string spec = WriteSpec(3, 0);
  const pid_t launcher = SpawnFake(spec, 2, {"DROVER_FAKE_STEP_MS=60000"});
  ASSERT_TRUE(WaitForRanks(2, 30)) << Log();
  const auto t0 = std::chrono::steady_clock::now();
  kill(launcher, SIGTERM);
  EXPECT_EQ(Wait(launcher), 1) << Log();
  EXPECT_LT(SecondsSince(t0), 10.0) << Log();
  EXPECT_THAT(Log(), HasSubstr("interrupted by signal 15"));
  EXPECT_TRUE(Gone(RankPid(0)));
  EXPECT_TRUE(Gone(RankPid(1)));
}

}  // namespace
}  // namespace drover
