// Parallel training as users run it: `drover train --nproc N` for every mode against one
// process (the losses of every step and the final model), a hung rank that the others
// give up on within the communicator deadline, and a two-rank job submitted to a
// coordinator with two one-slot agents, whose losses equal `drover train --nproc 2`'s.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/job_state.h"
#include "tests/integration/cluster.h"
#include "tests/integration/train_process.h"

namespace drover {
namespace {

using ::testing::HasSubstr;

// "loss" of each line of a metrics.jsonl.
std::vector<double> Losses(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 7)));
  }
  return losses;
}

class ParallelTrainTest : public TrainProcessFixture {
 protected:
  // A 2-layer, 2-head model (so pp 2 and tp 2 both fit), global batch 8.
  std::string Spec(const std::string& name, int steps) {
    const fs::path path = dir_ / (name + ".yaml");
    std::ofstream(path) << "name: " << name << "\noutput_dir: " << (dir_ / name).string()
                        << "\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, "
                           "vocab_size: 32}\n"
                        << "data: {train: " << (dir_ / "train.bin").string() << "}\n"
                        << "train: {steps: " << steps
                        << ", global_batch: 8, micro_batch: 2, seq_len: 16, lr: 0.005, "
                           "warmup_steps: 2, eval_every: 0, grad_clip: 0.5}\n"
                        << "parallel: {bucket_mb: 0.02, timeout_s: 20}\n"
                        << "checkpoint: {every_steps: 0}\n";
    return path.string();
  }

  // `drover train spec --nproc n args...`; returns the exit code.
  int Train(const std::string& spec, int n, std::vector<std::string> args = {}) {
    std::vector<std::string> argv = {kBin + "drover", "train",          spec, "--threads", "1",
                                     "--nproc",       std::to_string(n)};
    argv.insert(argv.end(), args.begin(), args.end());
    return Wait(Spawn(argv));
  }
};

struct Mode {
  const char* name;
  int nproc;
  std::vector<std::string> sets;
};

class ModeTest : public ParallelTrainTest, public ::testing::WithParamInterface<Mode> {};

TEST_P(ModeTest, DroverTrainNprocMatchesOneProcessStepForStep) {
  const Mode& mode = GetParam();
  // The one-process reference trains the mode's model (its model.* settings) alone.
  std::vector<std::string> args, model;
  for (const std::string& s : mode.sets) {
    args.insert(args.end(), {"--set", s});
    if (s.starts_with("model.")) model.insert(model.end(), {"--set", s});
  }
  const std::string one = Spec("one", 6);
  ASSERT_EQ(Train(one, 1, model), 0) << Log();
  const std::string spec = Spec("par", 6);
  ASSERT_EQ(Train(spec, mode.nproc, args), 0) << Log();
  const std::vector<double> want = Losses(dir_ / "one" / "metrics.jsonl");
  const std::vector<double> got = Losses(dir_ / "par" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(got.size(), want.size()) << Log();
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_NEAR(got[s], want[s], 1e-5 * want[s]) << "step " << s + 1;
  }
  const std::vector<float> a = ModelParams(dir_ / "one" / "model.bin");
  const std::vector<float> b = ModelParams(dir_ / "par" / "model.bin");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 0u);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
  EXPECT_LT(worst, 1e-5);
  EXPECT_THAT(Log(), HasSubstr("[rank " + std::to_string(mode.nproc - 1) + "]"));
}

INSTANTIATE_TEST_SUITE_P(
    EveryMode, ModeTest,
    ::testing::Values(Mode{"dp2", 2, {}}, Mode{"dp2_no_accumulation", 2, {"train.micro_batch=4"}},
                      Mode{"zero1", 2, {"parallel.zero_stage=1"}},
                      Mode{"zero2", 2, {"parallel.zero_stage=2"}},
                      Mode{"zero3", 2, {"parallel.zero_stage=3"}},
                      Mode{"zero3_hybrid", 4, {"parallel.zero_stage=3", "parallel.dp_shard=2"}},
                      Mode{"pp2_gpipe", 2, {"parallel.pp=2", "parallel.pp_schedule=gpipe"}},
                      Mode{"pp2_1f1b", 2, {"parallel.pp=2"}},
                      Mode{
                          "pp2_interleaved",
                          2,
                          {"model.n_layer=4", "parallel.pp=2", "parallel.pp_schedule=interleaved"}},
                      Mode{"tp2", 2, {"parallel.tp=2"}},
                      Mode{"dp2_pp2", 4, {"parallel.pp=2", "parallel.zero_stage=1"}},
                      Mode{"dp2_tp2", 4, {"parallel.tp=2", "parallel.zero_stage=1"}},
                      Mode{"pp2_tp2", 4, {"parallel.pp=2", "parallel.tp=2"}}),
    [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

// A rank that stops making progress (SIGSTOP: alive, connections open, silent) must not
// keep the others in a collective: they fail with DeadlineExceeded within
// parallel.timeout_s, and the launcher stops everything.
TEST_F(ParallelTrainTest, HungRankFailsTheOthersWithinTheDeadline) {
  const std::string spec = Spec("hang", 100000);
  const pid_t launcher = Spawn({kBin + "drover", "train", spec, "--threads", "1", "--nproc", "2",
                                "--set", "parallel.timeout_s=2"});
  // Wait until rank 1 trains (its pid is in its start line), then freeze it.
  pid_t rank1 = -1;
  const std::regex started("\\[rank 1\\] .*drover-trainer .*pid (\\d+)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch m;
    const std::string log = Log();
    if (std::regex_search(log, m, started) && Losses(dir_ / "hang" / "metrics.jsonl").size() > 2) {
      rank1 = std::stoi(m[1]);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(rank1, 0) << Log();
  ASSERT_EQ(kill(rank1, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const int code = Wait(launcher);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill(rank1, SIGKILL);  // in case the launcher did not
  EXPECT_EQ(code, 1) << Log();
  // 2 s deadline, then the launcher's stop of the frozen rank (SIGKILL after its grace).
  EXPECT_LT(waited, 2.0 + 3.0 + 3.0) << Log();
  EXPECT_THAT(Log(), HasSubstr("DEADLINE_EXCEEDED")) << Log();
}

// The real trainer under the coordinator: a job of world size 2 on two one-slot agents,
// so its ranks are on different agents and meet through the coordinator's rendezvous.
TEST_F(ParallelTrainTest, TwoRankJobOnTwoAgentsMatchesDroverTrainNproc2) {
  testing::ClusterOptions o;
  o.agents = 2;
  o.slots_per_agent = 1;
  o.trainer = "drover-trainer";
  o.name = "two_rank_job";
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();

  std::string yaml;
  {
    std::ifstream in(Spec("submitted", 8));
    yaml.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  yaml += "resources: {world_size: {min: 2, max: 2}, threads_per_rank: 1}\n";
  // Checkpoints, so that the job ends writing its final one (what it reports then must keep
  // the last step's loss: drover status showed a finished job's loss as 0).
  yaml = std::regex_replace(yaml, std::regex("checkpoint: \\{every_steps: 0\\}"),
                            "checkpoint: {every_steps: 4}");
  auto id = cluster.Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobInfo info;
  ASSERT_TRUE(cluster.WaitJob(
      *id,
      [](const v1::JobInfo& i) {
        return i.job().state() == v1::SUCCEEDED || i.job().state() == v1::FAILED ||
               i.job().state() == v1::CANCELLED;
      },
      60000, &info))
      << cluster.DebugLogs();
  ASSERT_EQ(info.job().state(), v1::SUCCEEDED) << info.job().reason() << cluster.DebugLogs();
  ASSERT_GE(info.attempts_size(), 1);
  std::set<std::string> nodes;
  for (const auto& a : info.attempts(info.attempts_size() - 1).placement()) nodes.insert(a.node());
  EXPECT_EQ(nodes.size(), 2u) << "both ranks on one agent";

  // Every rank's log reaches the CLI through its agent and the coordinator.
  for (int rank : {0, 1}) {
    const std::string log = (dir_ / ("logs-" + std::to_string(rank) + ".txt")).string();
    testing::Process cli(
        testing::Cluster::Bin("drover"),
        {"--coordinator", cluster.address(), "logs", *id, "--rank", std::to_string(rank)}, log);
    ASSERT_TRUE(cli.Wait(20000));
    EXPECT_THAT(testing::ReadAll(log), HasSubstr("rank=" + std::to_string(rank) + "/2"));
  }

  ASSERT_EQ(Train(Spec("local", 8), 2), 0) << Log();
  const std::vector<double> want = Losses(dir_ / "local" / "metrics.jsonl");
  const std::vector<double> got = Losses(dir_ / "submitted" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) EXPECT_NEAR(got[s], want[s], 1e-6 * want[s]);
  EXPECT_NEAR(info.job().last_loss(), got.back(), 1e-6 * got.back());
  EXPECT_GT(info.job().tokens_per_s(), 0);
}

// A job of two ranks whose steps take about 50 ms here, so that the 5 ms a straggler must be
// slower by is well inside them, with `extra` lines appended. The tests set the straggler
// factor to 1.5: on this 2-core machine, with the coordinator and agents beside them, two
// balanced ranks' busy times have differed by up to a quarter.
std::string StragglerJobYaml(const fs::path& dir, const std::string& name,
                             const std::string& extra = "", int min_world_size = 2) {
  return "name: " + name + "\noutput_dir: " + (dir / name).string() +
         "\nmodel: {n_layer: 4, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 32}\n"
         "data: {train: " +
         (dir / "train.bin").string() +
         "}\n"
         "train: {steps: 100000, global_batch: 8, micro_batch: 4, seq_len: 64, lr: 0.005, "
         "warmup_steps: 2, eval_every: 0}\n"
         "resources: {world_size: {min: " +
         std::to_string(min_world_size) + ", max: 2}, threads_per_rank: 1}\n" + extra;
}

// Stops `pid` for `stopped_ms` of every 25 (22: it takes about 8 times as long for its work)
// while it lives, as if something else held its CPU.
class Slowed {
 public:
  Slowed(pid_t pid, int stopped_ms)
      : pid_(pid), thread_([this, stopped_ms] {
          while (!stop_) {
            kill(pid_, SIGSTOP);
            std::this_thread::sleep_for(std::chrono::milliseconds(stopped_ms));
            kill(pid_, SIGCONT);
            std::this_thread::sleep_for(std::chrono::milliseconds(25 - stopped_ms));
          }
        }) {}
  ~Slowed() {
    stop_ = true;
    thread_.join();
    kill(pid_, SIGCONT);
  }

 private:
  const pid_t pid_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Waits until both ranks of `id` have reported a busy time (the job runs in step), and with
// `unnamed` until the coordinator names neither a straggler (on this loaded 2-core machine
// balanced ranks can differ by half at first: a job that drops stragglers needs a pace
// without one); the pid of rank 1 then.
pid_t WaitForPacedRanks(testing::Cluster& cluster, const std::string& id, v1::JobInfo* info,
                        bool unnamed = false) {
  pid_t rank1 = -1;
  const bool paced = cluster.WaitJob(
      id,
      [&](const v1::JobInfo& i) {
        int known = 0;
        for (const v1::TrainerStatus& t : i.trainers()) {
          if (t.progress().busy_ms() > 0) ++known;
          if (t.rank() == 1) rank1 = t.pid();
        }
        const bool in_step = known == 2 && (!unnamed || i.straggler_ranks_size() == 0);
        return in_step || IsTerminal(i.job().state());
      },
      60000, info);
  return paced && info->job().state() == v1::RUNNING ? rank1 : -1;
}

// A rank slowed on its node is named a straggler by `drover status` while the job runs, and
// the rank that waits for it is not.
TEST_F(ParallelTrainTest, ARankSlowedOnItsNodeIsNamedAStragglerByDroverStatus) {
  testing::ClusterOptions o;
  o.agents = 2;
  o.slots_per_agent = 1;
  o.trainer = "drover-trainer";
  o.name = "straggler";
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  auto id = cluster.Submit(StragglerJobYaml(dir_, "straggler",
                                            "checkpoint: {every_steps: 0}\n"
                                            "fault_tolerance: {straggler_factor: 1.5}\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobInfo info;
  // Started once neither rank is named, and rank 1 runs 3 ms of every 25, as the move and
  // drop tests below: this test failed once in a full suite (the rank kept waiting named,
  // as the move test's rank 0 was at 10 ms of 25 beside the suite's clang process).
  const pid_t rank1 = WaitForPacedRanks(cluster, *id, &info, /*unnamed=*/true);
  ASSERT_GT(rank1, 0) << info.job().reason() << cluster.DebugLogs();
  EXPECT_EQ(info.straggler_ranks_size(), 0) << info.notices(0);

  bool named = false, rank0_named = false, listed = false;
  const std::string status = (dir_ / "status.txt").string();
  {
    Slowed slowed(rank1, /*stopped_ms=*/22);
    named = cluster.WaitJob(
        *id,
        [&](const v1::JobInfo& i) {
          for (int r : i.straggler_ranks()) rank0_named = rank0_named || r == 0;
          return i.straggler_ranks_size() == 1 && i.straggler_ranks(0) == 1;
        },
        30000, &info);
    testing::Process cli(testing::Cluster::Bin("drover"),
                         {"--coordinator", cluster.address(), "status", *id}, status);
    listed = cli.Wait(20000);
  }
  EXPECT_TRUE(cluster.Cancel(*id).ok());
  ASSERT_TRUE(named) << "rank 1 was not named; notices: "
                     << (info.notices_size() > 0 ? info.notices(0) : "none") << cluster.DebugLogs();
  EXPECT_FALSE(rank0_named) << "the rank kept waiting was named a straggler";
  ASSERT_TRUE(listed);
  EXPECT_THAT(testing::ReadAll(status),
              ::testing::MatchesRegex("(.|\n)*notice: +rank 1 on [a-z0-9-]+ slot 0 is a "
                                      "straggler: busy [0-9]+ ms a step, against [0-9]+ ms for "
                                      "the other rank of its stage: they wait for it at every "
                                      "step(.|\n)*RANK +PID +STATE +STEP +LOSS +STEP_MS "
                                      "+BUSY_MS(.|\n)*"))
      << testing::ReadAll(status);
}

// What slowing rank 1 of a job that replaces its stragglers led to (RunWithRankOneSlowed).
struct SlowedRankOutcome {
  bool next_attempt = false;   // a second attempt ran within a minute
  v1::JobInfo info;            // the job then (cancelled right after)
  std::string slow_node;       // where rank 1 ran, slowed
  bool cordoned_slow = false;  // that node's slot 0 is cordoned as a straggler's
  std::string logs;
};

// Runs a straggler job that replaces stragglers after 1 s on `agents` one-slot agents, its
// world size in [min_world_size, 2]; once both ranks are in step, stops rank 1 for
// `stopped_ms` of every 25 (Slowed) until a second attempt runs.
void RunWithRankOneSlowed(const fs::path& dir, int agents, const std::string& name,
                          int min_world_size, int stopped_ms, SlowedRankOutcome* out) {
  testing::ClusterOptions o;
  o.agents = agents;
  o.slots_per_agent = 1;
  o.trainer = "drover-trainer";
  o.name = name;
  testing::Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  auto id = cluster.Submit(
      StragglerJobYaml(dir, name,
                       "checkpoint: {every_steps: 100000, keep_last: 2}\n"
                       "fault_tolerance: {straggler_factor: 1.5, replace_stragglers_after_s: 1}\n",
                       min_world_size));
  ASSERT_TRUE(id.ok()) << id.status();
  const pid_t rank1 = WaitForPacedRanks(cluster, *id, &out->info, /*unnamed=*/true);
  ASSERT_GT(rank1, 0) << out->info.job().reason() << cluster.DebugLogs();
  for (const v1::RankAssignment& p : out->info.job().placement()) {
    if (p.rank() == 1) out->slow_node = p.node();
  }
  {
    Slowed slowed(rank1, stopped_ms);
    out->next_attempt = cluster.WaitJob(
        *id,
        [](const v1::JobInfo& i) {
          return i.job().attempt() >= 2 && i.job().state() == v1::RUNNING;
        },
        60000, &out->info);
  }
  EXPECT_TRUE(cluster.Cancel(*id).ok());
  // What the ranks last reported, for a failure's message: the pace and busy times the
  // coordinator decided by.
  for (const v1::TrainerStatus& t : out->info.trainers()) {
    out->logs += "rank " + std::to_string(t.rank()) + " of attempt " + std::to_string(t.attempt()) +
                 ": busy " + std::to_string(t.progress().busy_ms()) + " ms, pace " +
                 std::to_string(t.progress().pace_ms()) + " ms\n";
  }
  out->logs += cluster.DebugLogs();
  auto workers = cluster.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : workers->workers()) {
    for (const v1::SlotFault& f : w.node().slot_faults()) {
      out->cordoned_slow =
          out->cordoned_slow ||
          (w.node().name() == out->slow_node && f.slot() == 0 &&
           f.reason().find("straggler rank 1") != std::string::npos && f.slow() == 1);
    }
  }
}

// A job that replaces its stragglers moves a rank slowed on its node to the free agent at a
// checkpoint it asks for, without spending a restart, and the slow slot is cordoned.
TEST_F(ParallelTrainTest, AJobThatReplacesStragglersMovesTheSlowRankToAFreeSlot) {
  // Rank 1 runs 3 ms of every 25, as in the drop test below. At 10 of 25, with a clang
  // process of the suite on the other core, rank 0 was named instead once in six runs (busy
  // 168 ms a step against 110): a loaded rank 0 computes slower too, and a rank stopped while
  // it waits for its reductions counts the stop as waiting.
  SlowedRankOutcome run;
  RunWithRankOneSlowed(dir_, /*agents=*/3, "replace", /*min_world_size=*/2, /*stopped_ms=*/22,
                       &run);
  if (HasFatalFailure()) return;
  const v1::JobInfo& info = run.info;
  ASSERT_TRUE(run.next_attempt) << info.job().state() << " " << info.job().reason() << run.logs;
  EXPECT_EQ(info.job().restarts(), 0);
  ASSERT_GE(info.attempts_size(), 2);
  EXPECT_THAT(info.attempts(0).end_reason(),
              ::testing::MatchesRegex("replacing straggler rank 1 on " + run.slow_node +
                                      " slot 0 \\(busy [0-9]+ ms a step against [0-9]+ ms for "
                                      "the others of its stage, for [0-9]+ s\\) at the "
                                      "checkpoint of step [0-9]+"));
  EXPECT_GT(info.attempts(1).resume_step(), 0);  // from the checkpoint it asked for
  for (const v1::RankAssignment& p : info.job().placement()) {
    EXPECT_NE(p.node(), run.slow_node) << "rank " << p.rank() << " placed on the slow node again";
  }
  EXPECT_TRUE(run.cordoned_slow) << "the slow slot was not cordoned";
}

// An elastic job with no free slot drops a rank slowed on its node: at a checkpoint it
// asks for, it shrinks to the one rank left, without spending a restart, and the slow slot
// is cordoned.
TEST_F(ParallelTrainTest, AnElasticJobWithoutAFreeSlotDropsItsSlowRank) {
  // Rank 1 runs 3 ms of every 25: rank 0 alone, with twice its work, should beat it by far,
  // also while other tests load this machine's two cores (5 ms of 25 was too little then: a
  // loaded rank 0 is slow too, and the drop rightly did not pay). The job's pace before is
  // known: both ranks have reported one.
  SlowedRankOutcome run;
  RunWithRankOneSlowed(dir_, /*agents=*/2, "drop", /*min_world_size=*/1, /*stopped_ms=*/22, &run);
  if (HasFatalFailure()) return;
  const v1::JobInfo& info = run.info;
  ASSERT_TRUE(run.next_attempt) << info.job().state() << " " << info.job().reason() << run.logs;
  EXPECT_EQ(info.job().restarts(), 0);
  ASSERT_GE(info.attempts_size(), 2);
  EXPECT_THAT(info.attempts(0).end_reason(),
              ::testing::MatchesRegex(
                  "dropping straggler rank 1 on " + run.slow_node +
                  " slot 0 \\(busy [0-9]+ ms a step against [0-9]+ ms for the others of its "
                  "stage, for [0-9]+ s\\) at the checkpoint of step [0-9]+, shrinking from 2 to "
                  "1 ranks: no free slot to move it to, and a step without it should take about "
                  "[0-9]+ ms \\([0-9]+ ms at 2 ranks without stragglers, times 2/1\\) against "
                  "[0-9]+ ms now"));
  EXPECT_GT(info.attempts(1).resume_step(), 0);  // from the checkpoint it asked for
  ASSERT_EQ(info.job().placement_size(), 1);
  EXPECT_NE(info.job().placement(0).node(), run.slow_node);
  EXPECT_TRUE(run.cordoned_slow) << "the slow slot was not cordoned";
}

}  // namespace
}  // namespace drover
