// The CLI against a real coordinator that goes away and comes back: `drover logs -f`
// follows through a kill -9 and restart, `drover rm` deletes for good, and calls that are
// safe to repeat wait for a coordinator that is not up yet. Waits are on conditions with
// deadlines; every process is killed by the Cluster and Process destructors.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <regex>

#include "common/protocol_version.h"
#include "tests/integration/cluster.h"

namespace drover::testing {
namespace {

class CliServiceTest : public ::testing::Test {
 protected:
  void StartCluster(int agents) {
    ClusterOptions o;
    o.agents = agents;
    o.name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    cluster_ = std::make_unique<Cluster>(o);
    ASSERT_TRUE(cluster_->Start()) << "workers did not register\n" << cluster_->DebugLogs();
  }
  std::vector<std::string> Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--coordinator", cluster_->address()});
    return args;
  }
  std::string WriteSpec(const std::string& name, int steps, int step_ms) {
    const std::string path = (cluster_->root() / (name + ".yaml")).string();
    std::ofstream(path) << cluster_->JobYaml(name, 1, 1, steps, 10, 3, 30,
                                             "step_ms=" + std::to_string(step_ms) + "\n");
    return path;
  }
  std::string SubmitByCli(const std::string& spec) {
    CliResult r = RunCli(cluster_->root(), Cli({"submit", spec}));
    EXPECT_EQ(r.code, 0) << r.out;
    return r.out.substr(0, r.out.find('\n'));
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(CliServiceTest, LogsFollowRidesThroughACoordinatorRestartWithoutRepeatingOrLosingLines) {
  StartCluster(1);
  constexpr int kSteps = 60;
  const std::string id = SubmitByCli(WriteSpec("follow", kSteps, 60));
  ASSERT_FALSE(id.empty());
  const std::string out = (cluster_->root() / "follow.out").string();
  // --retry-for 1: it says it lost the coordinator after a second, which the test waits for.
  Process follow(Cluster::Bin("drover"), Cli({"--retry-for", "1", "logs", id, "-f"}), out);
  ASSERT_TRUE(
      WaitUntil([&] { return ReadAll(out).find("step 5 loss") != std::string::npos; }, 15000))
      << ReadAll(out) << cluster_->DebugLogs();
  cluster_->coordinator()->Kill(SIGKILL);
  ASSERT_TRUE(WaitUntil(
      [&] { return ReadAll(out).find("lost the coordinator") != std::string::npos; }, 15000))
      << ReadAll(out);
  cluster_->StartCoordinator();
  int ws = 0;
  ASSERT_TRUE(follow.Wait(40000, &ws)) << "logs -f did not end with the job\n"
                                       << ReadAll(out) << cluster_->DebugLogs();
  const std::string text = ReadAll(out);
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << text;
  // Every step exactly once, in order, and the end.
  std::vector<int> steps;
  const std::regex step_line(R"(^step (\d+) loss)");
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, step_line)) steps.push_back(std::stoi(m[1]));
  }
  ASSERT_EQ(static_cast<int>(steps.size()), kSteps) << text;
  for (int i = 0; i < kSteps; ++i) ASSERT_EQ(steps[i], i + 1) << text;
  EXPECT_NE(text.find("fake-trainer: done after step " + std::to_string(kSteps)), std::string::npos)
      << text;
}

// `drover checkpoint` of a job that cannot save one says why and exits 1 (the request path
// itself is pinned in elastic_test.cc, with the real trainer).
TEST_F(CliServiceTest, CheckpointRefusesAJobThatIsNotRunning) {
  StartCluster(1);
  CliResult unknown = RunCli(cluster_->root(), Cli({"checkpoint", "j-nope"}));
  EXPECT_EQ(unknown.code, 1) << unknown.out;
  EXPECT_NE(unknown.out.find("no job j-nope"), std::string::npos) << unknown.out;
  const std::string id = SubmitByCli(WriteSpec("ckpt", 10000, 50));
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(RunCli(cluster_->root(), Cli({"cancel", id})).code, 0);
  CliResult ended = RunCli(cluster_->root(), Cli({"checkpoint", id, "--wait"}));
  EXPECT_EQ(ended.code, 1) << ended.out;
  EXPECT_NE(ended.out.find("job " + id + " is CANCELLED: only a running job can save a checkpoint"),
            std::string::npos)
      << ended.out;
}

// drover submit --after through the CLI: a job that does not exist is input to fix (exit 2);
// a job after another waits, saying for what, and runs once that one has succeeded.
TEST_F(CliServiceTest, SubmitAfterAJobWaitsForItToSucceed) {
  StartCluster(1);
  const std::string spec = WriteSpec("after", 20, 20);
  CliResult missing = RunCli(cluster_->root(), Cli({"submit", spec, "--after", "j-nope"}));
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("submit: no job j-nope to run after"), std::string::npos)
      << missing.out;
  // Long enough (5 s) to be running still at the coordinator's next pass, at most a second on.
  const std::string first = SubmitByCli(WriteSpec("first", 250, 20));
  ASSERT_FALSE(first.empty());
  CliResult then = RunCli(cluster_->root(), Cli({"submit", spec, "--after", first}));
  ASSERT_EQ(then.code, 0) << then.out;
  const std::string second = then.out.substr(0, then.out.find('\n'));
  v1::JobInfo waiting;  // as of the coordinator's next scheduling pass
  ASSERT_TRUE(cluster_->WaitJob(
      second, [](const v1::JobInfo& i) { return !i.job().reason().empty(); }, 10000, &waiting));
  EXPECT_EQ(waiting.job().state(), v1::PENDING);
  CliResult status = RunCli(cluster_->root(), Cli({"status", second}));
  EXPECT_NE(status.out.find("waiting for " + first), std::string::npos) << status.out;
  v1::JobInfo done;
  ASSERT_TRUE(cluster_->WaitJob(
      second, [](const v1::JobInfo& i) { return i.job().state() == v1::SUCCEEDED; }, 60000, &done))
      << done.job().reason() << cluster_->DebugLogs();
  auto before = cluster_->GetJob(first);
  ASSERT_TRUE(before.ok());
  EXPECT_EQ(before->job().state(), v1::SUCCEEDED);
  EXPECT_GE(done.job().started_ms(), before->job().finished_ms()) << "it ran after, not beside";
}

// drover submit --time-limit and drover time-limit through the CLI: the limit is changed
// while the job runs, and at the new one the job stops at a checkpoint, FAILED, saying so.
TEST_F(CliServiceTest, TimeLimitChangesARunningJobsLimitAndItStopsThere) {
  StartCluster(1);
  const std::string spec = WriteSpec("limited", 100000, 50);
  CliResult submitted = RunCli(cluster_->root(), Cli({"submit", spec, "--time-limit", "1h"}));
  ASSERT_EQ(submitted.code, 0) << submitted.out;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  v1::JobInfo info;
  ASSERT_TRUE(cluster_->WaitJob(
      id, [](const v1::JobInfo& i) { return i.job().state() == v1::RUNNING; }, 20000, &info))
      << cluster_->DebugLogs();
  CliResult status = RunCli(cluster_->root(), Cli({"status", id}));
  EXPECT_NE(status.out.find("time limit:  1h00m, "), std::string::npos) << status.out;
  CliResult bad = RunCli(cluster_->root(), Cli({"time-limit", id, "soon"}));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("drover time-limit: 'soon' does not start with a number"),
            std::string::npos)
      << bad.out;

  CliResult changed = RunCli(cluster_->root(), Cli({"time-limit", id, "2s"}));
  ASSERT_EQ(changed.code, 0) << changed.out;
  EXPECT_EQ(changed.out.rfind(id + " RUNNING, time limit 2.0s (was 1h00m), ", 0), 0u)
      << changed.out;
  EXPECT_NE(changed.out.find(" used\n"), std::string::npos) << changed.out;
  ASSERT_TRUE(cluster_->WaitJob(
      id, [](const v1::JobInfo& i) { return i.job().state() == v1::FAILED; }, 20000, &info))
      << info.job().reason() << cluster_->DebugLogs();
  EXPECT_EQ(info.job().reason().rfind("time limit reached: it ran ", 0), 0u) << info.job().reason();
  EXPECT_NE(info.job().reason().find(" of its 2.0s (resources.time_limit_minutes); "),
            std::string::npos)
      << info.job().reason();
  EXPECT_NE(info.job().reason().find("; stopped at the checkpoint of step "), std::string::npos)
      << info.job().reason();
  CliResult finished = RunCli(cluster_->root(), Cli({"time-limit", id, "1h"}));
  EXPECT_EQ(finished.code, 1) << finished.out;
  EXPECT_NE(finished.out.find("a finished job's time limit cannot change"), std::string::npos)
      << finished.out;
}

// Backfill with real agents: on three slots, a two-rank job with a 10-minute limit runs and a
// three-rank job waits for its slots. A one-rank job with a 1-minute limit starts on the free
// slot at once, saying why, and finishes while the big one waits; one without a limit stays
// queued, its status saying what would let it start. Cancelled, the running job's slots go to
// the big one.
TEST_F(CliServiceTest, AShortJobBackfillsTheFreeSlotWhileABigOneWaits) {
  StartCluster(3);
  const std::string running_spec = (cluster_->root() / "running.yaml").string();
  std::ofstream(running_spec) << cluster_->JobYaml("running", 2, 2, 100000, 10, 3, 30,
                                                   "step_ms=50\n");
  CliResult r = RunCli(cluster_->root(), Cli({"submit", running_spec, "--time-limit", "10m"}));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string running = r.out.substr(0, r.out.find('\n'));
  v1::JobInfo info;
  ASSERT_TRUE(cluster_->WaitJob(
      running, [](const v1::JobInfo& i) { return i.job().state() == v1::RUNNING; }, 20000, &info))
      << cluster_->DebugLogs();
  const std::string big_spec = (cluster_->root() / "big.yaml").string();
  std::ofstream(big_spec) << cluster_->JobYaml("big", 3, 3, 20, 10, 3, 30, "step_ms=20\n");
  const std::string big = SubmitByCli(big_spec);
  const std::string open = SubmitByCli(WriteSpec("open", 20, 20));
  // 3 s of steps: running long enough to be seen so.
  r = RunCli(cluster_->root(), Cli({"submit", WriteSpec("short", 150, 20), "--time-limit", "1m"}));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string short_job = r.out.substr(0, r.out.find('\n'));
  ASSERT_TRUE(cluster_->WaitJob(
      short_job, [](const v1::JobInfo& i) { return i.job().state() == v1::RUNNING; }, 20000, &info))
      << info.job().reason() << cluster_->DebugLogs();
  EXPECT_EQ(info.job().reason(), "started before " + big +
                                     ", which waits for slots, by backfill: its time limit ends "
                                     "before that job can start");
  ASSERT_TRUE(cluster_->WaitJob(
      short_job, [](const v1::JobInfo& i) { return i.job().state() == v1::SUCCEEDED; }, 30000,
      &info))
      << info.job().reason() << cluster_->DebugLogs();
  auto waiting = cluster_->GetJob(big);
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(waiting->job().state(), v1::PENDING);
  CliResult status = RunCli(cluster_->root(), Cli({"status", open}));
  EXPECT_NE(status.out.find("queued behind an earlier cpu job (" + big + " can start within "),
            std::string::npos)
      << status.out;

  ASSERT_EQ(RunCli(cluster_->root(), Cli({"cancel", running})).code, 0);
  ASSERT_TRUE(cluster_->WaitJob(
      big, [](const v1::JobInfo& i) { return i.job().state() == v1::RUNNING; }, 20000, &info))
      << info.job().reason() << cluster_->DebugLogs();
  auto still = cluster_->GetJob(open);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->job().state(), v1::PENDING) << still->job().reason();
}

// drover priority, suspend and resume through the CLI: what each prints, a refusal that
// names what to do, and drover jobs --state suspended.
TEST_F(CliServiceTest, PrioritySuspendAndResumeSayWhatTheyDid) {
  StartCluster(1);
  const std::string running = SubmitByCli(WriteSpec("running", 100000, 50));
  ASSERT_FALSE(running.empty());
  v1::JobInfo info;
  ASSERT_TRUE(cluster_->WaitJob(
      running, [](const v1::JobInfo& i) { return i.job().state() == v1::RUNNING; }, 20000, &info))
      << cluster_->DebugLogs();
  const std::string queued = SubmitByCli(WriteSpec("queued", 10, 50));
  ASSERT_FALSE(queued.empty());

  CliResult priority = RunCli(cluster_->root(), Cli({"priority", queued, "3"}));
  EXPECT_EQ(priority.code, 0) << priority.out;
  EXPECT_EQ(priority.out, queued + " PENDING, priority 3 (was 0)\n");
  CliResult suspend =
      RunCli(cluster_->root(), Cli({"suspend", queued, "--reason", "not today", "--wait"}));
  EXPECT_EQ(suspend.code, 0) << suspend.out;
  EXPECT_NE(suspend.out.find(queued + " SUSPENDED: after drover resume " + queued +
                             " it starts from step 0"),
            std::string::npos)
      << suspend.out;
  CliResult listed = RunCli(cluster_->root(), Cli({"jobs", "--state", "suspended"}));
  EXPECT_EQ(listed.code, 0) << listed.out;
  EXPECT_NE(listed.out.find(queued), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find(": not today; drover resume " + queued), std::string::npos)
      << listed.out;
  EXPECT_EQ(listed.out.find(running), std::string::npos) << listed.out;

  // A job that saves no checkpoints, raised above the running one, which yields its slot at
  // its next checkpoint; suspending it is refused without --now.
  const std::string plain = (cluster_->root() / "plain.yaml").string();
  std::ofstream(plain) << cluster_->JobYaml("plain", 1, 1, 100000, 0, 3, 30, "step_ms=50\n");
  const std::string no_ckpt = SubmitByCli(plain);
  CliResult refused = RunCli(cluster_->root(), Cli({"priority", no_ckpt, "9"}));
  ASSERT_EQ(refused.code, 0) << refused.out;
  EXPECT_EQ(refused.out, no_ckpt + " PENDING, priority 9 (was 0)\n");
  ASSERT_TRUE(cluster_->WaitJob(
      no_ckpt, [](const v1::JobInfo& i) { return i.job().state() == v1::RUNNING; }, 20000, &info))
      << cluster_->DebugLogs();
  refused = RunCli(cluster_->root(), Cli({"suspend", no_ckpt}));
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_NE(refused.out.find("saves no checkpoints"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("--now suspends it anyway"), std::string::npos) << refused.out;
  CliResult now = RunCli(cluster_->root(), Cli({"suspend", no_ckpt, "--now"}));
  EXPECT_EQ(now.code, 0) << now.out;
  EXPECT_EQ(now.out, no_ckpt + " SUSPENDED; drover resume " + no_ckpt + " places it again\n");
  CliResult resumed = RunCli(cluster_->root(), Cli({"resume", queued}));
  EXPECT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_EQ(resumed.out, queued + " PENDING\n");
  // A negative priority as it is written, without "--"; what is not one is refused. (The
  // resumed job may have been placed on the slot the other one gave back by now.)
  const std::regex state("(PENDING|RUNNING)");
  CliResult lowered = RunCli(cluster_->root(), Cli({"priority", queued, "-5"}));
  EXPECT_EQ(lowered.code, 0) << lowered.out;
  EXPECT_EQ(std::regex_replace(lowered.out, state, "S"), queued + " S, priority -5 (was 3)\n");
  lowered = RunCli(cluster_->root(), Cli({"priority", queued, "--", "-7"}));
  EXPECT_EQ(std::regex_replace(lowered.out, state, "S"), queued + " S, priority -7 (was -5)\n");
  CliResult bad = RunCli(cluster_->root(), Cli({"priority", queued, "-5", "--soon"}));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("not understood: --soon"), std::string::npos) << bad.out;
}

// A GPU node's agent describes each slot as its driver probe found it; the table shows the
// first slot's GPU beside the device kind.
TEST_F(CliServiceTest, WorkersShowsTheGpuOfAGpuNode) {
  StartCluster(1);
  auto workers = v1::WorkerService::NewStub(MakeChannel(cluster_->address(), {}));
  v1::RegisterRequest req;
  req.set_name("gpu7");
  req.set_agent_id("gpu7-1");
  req.set_protocol_version(kProtocolVersion);
  for (int i = 0; i < 2; ++i) {
    v1::Slot* slot = req.add_slots();
    slot->set_index(i);
    slot->set_device(v1::CUDA);
    slot->set_description("cuda:" + std::to_string(i) + " NVIDIA H200 (139 GiB)");
  }
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, 5000);
  ASSERT_TRUE(workers->Register(&ctx, req, &resp).ok());
  CliResult table = RunCli(cluster_->root(), Cli({"workers"}));
  ASSERT_EQ(table.code, 0) << table.out;
  EXPECT_TRUE(std::regex_search(table.out, std::regex("\ngpu7 +ALIVE +CUDA NVIDIA H200 \\(139 "
                                                      "GiB\\) +2 +2 ")))
      << table.out;
  EXPECT_TRUE(std::regex_search(table.out, std::regex("\nw0 +ALIVE +CPU +[0-9]"))) << table.out;
}

TEST_F(CliServiceTest, RmRefusesALiveJobAndDeletesAFinishedOneForGood) {
  StartCluster(1);
  const std::string id = SubmitByCli(WriteSpec("rm", 10000, 50));
  ASSERT_FALSE(id.empty());
  CliResult live = RunCli(cluster_->root(), Cli({"rm", id}));
  EXPECT_EQ(live.code, 1) << live.out;
  EXPECT_NE(live.out.find("cancel it first"), std::string::npos) << live.out;
  ASSERT_EQ(RunCli(cluster_->root(), Cli({"cancel", id})).code, 0);
  CliResult rm = RunCli(cluster_->root(), Cli({"rm", id}));
  EXPECT_EQ(rm.code, 0) << rm.out;
  EXPECT_NE(rm.out.find(id + " deleted"), std::string::npos) << rm.out;
  CliResult gone = RunCli(cluster_->root(), Cli({"status", id}));
  EXPECT_EQ(gone.code, 1) << gone.out;
  EXPECT_NE(gone.out.find("no job " + id), std::string::npos) << gone.out;

  cluster_->coordinator()->Kill(SIGKILL);
  cluster_->StartCoordinator();
  // Calls retry until the restarted coordinator answers; it must not know the job.
  CliResult after = RunCli(cluster_->root(), Cli({"status", id}));
  EXPECT_EQ(after.code, 1) << after.out;
  EXPECT_NE(after.out.find("no job " + id), std::string::npos) << after.out;
  CliResult jobs = RunCli(cluster_->root(), Cli({"jobs", "--all"}));
  EXPECT_EQ(jobs.code, 0) << jobs.out;
  EXPECT_EQ(jobs.out.find(id), std::string::npos) << jobs.out;
}

TEST_F(CliServiceTest, SubmitWaitsForACoordinatorThatIsNotUpYetAndMakesOneJob) {
  ClusterOptions o;
  o.agents = 0;
  o.name = "SubmitWaitsForACoordinatorThatIsNotUpYet";
  cluster_ = std::make_unique<Cluster>(o);
  const std::string spec = WriteSpec("early", 5, 10);
  const std::string out = (cluster_->root() / "submit.out").string();
  Process submit(Cluster::Bin("drover"), Cli({"--retry-for", "30", "submit", spec}), out);
  // Whether its first try came before the coordinator or not, the outcome is the same.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  cluster_->StartCoordinator();
  int ws = 0;
  ASSERT_TRUE(submit.Wait(30000, &ws)) << ReadAll(out);
  ASSERT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 0) << ReadAll(out);
  auto listed = cluster_->ListJobs();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs_size(), 1);
  EXPECT_EQ(ReadAll(out), listed->jobs(0).job_id() + "\n");
  EXPECT_FALSE(listed->jobs(0).submitter().empty());
  EXPECT_EQ(listed->jobs(0).request_id().size(), 32u);
}

TEST_F(CliServiceTest, LogsOfARankTheJobDoesNotHaveIsRefusedNamingItsRanks) {
  StartCluster(1);
  const std::string id = SubmitByCli(WriteSpec("ranks", 10000, 50));
  ASSERT_FALSE(id.empty());
  CliResult r = RunCli(cluster_->root(), Cli({"logs", id, "--rank", "5"}));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("job " + id + " has ranks 0..0; there is no rank 5"), std::string::npos)
      << r.out;
  EXPECT_EQ(RunCli(cluster_->root(), Cli({"logs", id, "--rank", "0"})).code, 0);
}

TEST_F(CliServiceTest, TopOnceShowsTheNodesAndARunningJobWithItsProgress) {
  StartCluster(2);
  const std::string id = SubmitByCli(WriteSpec("watched", 10000, 50));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto info = cluster_->GetJob(id);
        return info.ok() && info->job().state() == v1::RUNNING && info->job().last_step() >= 3;
      },
      20000))
      << cluster_->DebugLogs();
  CliResult r = RunCli(cluster_->root(), Cli({"top", "--once"}));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("nodes 2/2 alive, slots 1/2 used - jobs 1 running"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("NODE  STATE  SLOTS  HEARTBEAT"), std::string::npos) << r.out;
  // One node runs the job's rank, the other is idle; which is which is the scheduler's.
  EXPECT_NE(r.out.find("ALIVE  1/1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ALIVE  0/1"), std::string::npos) << r.out;
  const std::regex row(id + R"(\s+watched\s+RUNNING\s+1\s+1\s+(\d+)/10000\s+\d+\.\d%\s+)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, row)) << r.out;
  EXPECT_GE(std::stoi(m[1]), 3) << r.out;
  // Frames for scripts: no terminal, so no escape sequences.
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
}

// After a crash the job resumes from its checkpoint at step 20 and trains steps 21..38
// again; drover status and drover top say so while it does.
TEST_F(CliServiceTest, StatusAndTopMarkTheStepsAResumedAttemptRecomputes) {
  StartCluster(1);
  const std::string path = (cluster_->root() / "resumed.yaml").string();
  std::ofstream(path) << cluster_->JobYaml("resumed", 1, 1, 60, 20, 3, 30,
                                           "step_ms=400\ncrash_at_step=39\n");
  const std::string id = SubmitByCli(path);
  ASSERT_FALSE(id.empty());
  v1::JobInfo seen;
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto info = cluster_->GetJob(id);
        if (!info.ok()) return false;
        seen = *info;
        return info->job().attempt() == 2 && info->job().last_step() > 20;
      },
      40000))
      << seen.DebugString() << cluster_->DebugLogs();
  const int64_t furthest = seen.job().furthest_step();
  ASSERT_GE(furthest, 30) << seen.DebugString();
  CliResult status = RunCli(cluster_->root(), Cli({"status", id}));
  CliResult top = RunCli(cluster_->root(), Cli({"top", "--once"}));
  ASSERT_EQ(status.code, 0) << status.out;
  ASSERT_EQ(top.code, 0) << top.out;
  // The window is (38 - 20) steps of 400 ms; a CLI that ran past it would show no mark
  // rightly, so the step it printed is checked to be inside the window first.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(status.out, m, std::regex(R"(progress:\s+step (\d+)/60)")))
      << status.out;
  ASSERT_LT(std::stoll(m[1]), furthest) << "the CLI ran past the window\n" << status.out;
  EXPECT_NE(status.out.find("(recomputed after restart)"), std::string::npos) << status.out;
  // The attempt's mesh, as its trainers derive it.
  EXPECT_NE(status.out.find("layout:      dp1 x pp1 x tp1, 12 micro-batches per step\n"),
            std::string::npos)
      << status.out;
  ASSERT_TRUE(std::regex_search(top.out, m, std::regex(id + R"(.*\s(\d+)/60(\*?)\s)"))) << top.out;
  if (std::stoll(m[1]) < furthest) {
    EXPECT_EQ(m[2], "*") << top.out;
    EXPECT_NE(top.out.find("* recomputed after restart"), std::string::npos) << top.out;
  }
}

}  // namespace
}  // namespace drover::testing
