// Control plane end to end on loopback: a real coordinator, real agents and the scripted
// trainer (drover-fake-trainer), with short timing knobs (heartbeat 200 ms, node timeout
// 1 s). Every wait is on a condition with a deadline; every process is killed by the
// Cluster destructor, also when an assertion fails.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "tests/integration/cluster.h"
#include "worker/rendezvous_client.h"

namespace drover::testing {
namespace {

bool Terminal(const v1::JobInfo& i) {
  v1::JobState s = i.job().state();
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

std::string Describe(const v1::JobInfo& info) {
  std::string s = "job " + info.job().job_id() + " state " + v1::JobState_Name(info.job().state()) +
                  " attempt " + std::to_string(info.job().attempt()) + " restarts " +
                  std::to_string(info.job().restarts()) + " reason '" + info.job().reason() + "'";
  for (const auto& a : info.attempts()) {
    s += "\n  attempt " + std::to_string(a.attempt()) + " world " + std::to_string(a.world_size()) +
         " resume " + std::to_string(a.resume_step()) + " end '" + a.end_reason() + "'";
  }
  return s;
}

// Pids of the current attempt's trainers that reported a pid.
std::vector<pid_t> TrainerPids(const v1::JobInfo& info) {
  std::vector<pid_t> pids;
  for (const auto& t : info.trainers()) {
    if (t.attempt() == info.job().attempt() && t.pid() > 0) pids.push_back(t.pid());
  }
  return pids;
}

class ControlPlaneTest : public ::testing::Test {
 protected:
  void StartCluster(int agents, int slots = 1, int heartbeat_interval_ms = 200,
                    int heartbeat_timeout_ms = 1000) {
    ClusterOptions o;
    o.agents = agents;
    o.slots_per_agent = slots;
    o.heartbeat_interval_ms = heartbeat_interval_ms;
    o.heartbeat_timeout_ms = heartbeat_timeout_ms;
    o.name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    cluster_ = std::make_unique<Cluster>(o);
    ASSERT_TRUE(cluster_->Start()) << "workers did not register\n" << cluster_->DebugLogs();
  }
  std::string Submit(const std::string& yaml) {
    auto id = cluster_->Submit(yaml);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }
  // Waits for the job to end; returns its final info.
  v1::JobInfo WaitEnd(const std::string& id, int64_t timeout_ms) {
    v1::JobInfo info;
    bool ended = cluster_->WaitJob(id, Terminal, timeout_ms, &info);
    EXPECT_TRUE(ended) << "job did not end in " << timeout_ms << " ms: " << Describe(info) << "\n"
                       << cluster_->DebugLogs();
    return info;
  }
  // Waits until the current attempt's trainers all run and reached `step`.
  v1::JobInfo WaitStep(const std::string& id, int64_t step, int world, int64_t timeout_ms) {
    v1::JobInfo info;
    bool ok = cluster_->WaitJob(
        id,
        [&](const v1::JobInfo& i) {
          if (i.job().state() != v1::RUNNING) return false;
          int at = 0;
          for (const auto& t : i.trainers()) {
            at += t.attempt() == i.job().attempt() && t.progress().step() >= step &&
                  t.state() == v1::TRAINER_RUNNING;
          }
          return at >= world;
        },
        timeout_ms, &info);
    EXPECT_TRUE(ok) << "trainers did not reach step " << step << ": " << Describe(info) << "\n"
                    << cluster_->DebugLogs();
    return info;
  }

  std::unique_ptr<Cluster> cluster_;
};

TEST_F(ControlPlaneTest, JobRunsToSuccessThroughTheCli) {
  StartCluster(2);
  const std::string addr = cluster_->address();
  const std::string spec = (cluster_->root() / "ok.yaml").string();
  // steps: 5 in the file, 20 through --set: the override must win.
  std::string yaml = cluster_->JobYaml("ok", 2, 2, 5, 10, 3, 30, "step_ms=20\n");
  std::ofstream(spec) << yaml;
  CliResult submit =
      RunCli(cluster_->root(), {"--coordinator", addr, "submit", spec, "--set", "train.steps=20"});
  ASSERT_EQ(submit.code, 0) << submit.out;
  std::string id = submit.out.substr(0, submit.out.find('\n'));
  CliResult wait = RunCli(cluster_->root(), {"--coordinator", addr, "wait", id, "--timeout", "15"});
  EXPECT_EQ(wait.code, 0) << wait.out << cluster_->DebugLogs();
  auto info = cluster_->GetJob(id);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->job().state(), v1::SUCCEEDED) << Describe(*info);
  EXPECT_EQ(info->job().attempt(), 1);
  EXPECT_EQ(info->job().restarts(), 0);
  CliResult status = RunCli(cluster_->root(), {"--coordinator", addr, "status", id, "--json"});
  EXPECT_EQ(status.code, 0);
  EXPECT_NE(status.out.find("\"SUCCEEDED\""), std::string::npos) << status.out;
  CliResult jobs = RunCli(cluster_->root(), {"--coordinator", addr, "jobs"});
  EXPECT_EQ(jobs.code, 0);
  EXPECT_NE(jobs.out.find(id), std::string::npos) << jobs.out;
  CliResult workers = RunCli(cluster_->root(), {"--coordinator", addr, "workers"});
  EXPECT_EQ(workers.code, 0);
  EXPECT_NE(workers.out.find("w1"), std::string::npos) << workers.out;
  // `drover logs` prints rank 0's output, shipped by its agent (the tail may still be on
  // its way when the job ends).
  CliResult logs;
  bool complete = WaitUntil(
      [&] {
        logs = RunCli(cluster_->root(), {"--coordinator", addr, "logs", id, "--rank", "0"});
        return logs.code == 0 &&
               logs.out.find("fake-trainer: done after step 20") != std::string::npos;
      },
      5000, 100);
  EXPECT_TRUE(complete) << "drover logs printed:\n" << logs.out;
  EXPECT_NE(logs.out.find("rank 0/2"), std::string::npos) << logs.out;
}

TEST_F(ControlPlaneTest, CliRejectsBadSpecAndReportsUnreachableCoordinator) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("drover_cli_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "bad.yaml") << "name: x\ntrain:\n  stepz: 3\n";
  const std::string nobody = "127.0.0.1:" + std::to_string(FreePort());
  CliResult bad = RunCli(dir, {"--coordinator", nobody, "submit", (dir / "bad.yaml").string()});
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("stepz"), std::string::npos) << bad.out;
  CliResult down = RunCli(dir, {"--coordinator", nobody, "--retry-for", "0.5", "jobs"});
  EXPECT_EQ(down.code, 1) << down.out;
  EXPECT_NE(down.out.find("cannot reach the coordinator"), std::string::npos) << down.out;
  EXPECT_EQ(std::count(down.out.begin(), down.out.end(), '\n'), 1) << down.out;
  std::filesystem::remove_all(dir);
}

TEST_F(ControlPlaneTest, TrainerKilledIsRecoveredFromTheLatestCheckpoint) {
  StartCluster(2);
  std::string id = Submit(cluster_->JobYaml("tkill", 2, 2, 40, 5, 3, 30, "step_ms=40\n"));
  ASSERT_FALSE(id.empty());
  v1::JobInfo running = WaitStep(id, 8, 2, 15000);
  std::vector<pid_t> pids = TrainerPids(running);
  ASSERT_EQ(pids.size(), 2u) << Describe(running);
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  v1::JobInfo info = WaitEnd(id, 20000);
  ASSERT_EQ(info.job().state(), v1::SUCCEEDED) << Describe(info);
  EXPECT_EQ(info.job().attempt(), 2) << Describe(info);
  EXPECT_EQ(info.job().restarts(), 1);
  ASSERT_GE(info.attempts_size(), 2);
  EXPECT_GE(info.attempts(1).resume_step(), 5) << Describe(info);
  // The survivor of attempt 1 was stopped.
  EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(pids[0]); }, 3000));
}

TEST_F(ControlPlaneTest, AgentKilledIsRecoveredOnTheSurvivingNodes) {
  StartCluster(3);
  std::string id = Submit(cluster_->JobYaml("akill", 2, 2, 40, 5, 3, 30, "step_ms=40\n"));
  ASSERT_FALSE(id.empty());
  v1::JobInfo running = WaitStep(id, 8, 2, 15000);
  ASSERT_EQ(running.job().placement_size(), 2);
  std::string victim = running.job().placement(1).node();
  std::vector<pid_t> pids = TrainerPids(running);
  Process* agent = cluster_->agent(victim);
  ASSERT_NE(agent, nullptr) << victim;
  agent->Kill(SIGKILL);
  v1::JobInfo info = WaitEnd(id, 20000);
  ASSERT_EQ(info.job().state(), v1::SUCCEEDED) << Describe(info);
  EXPECT_EQ(info.job().attempt(), 2) << Describe(info);
  EXPECT_EQ(info.job().restarts(), 1);
  for (const auto& r : info.job().placement()) EXPECT_NE(r.node(), victim);
  // No trainer of attempt 1 lives on: the dead agent's died with it (PDEATHSIG), the
  // survivor was stopped by its agent.
  for (pid_t pid : pids) EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(pid); }, 3000)) << pid;
}

// With a node timeout of 20 s, only the agent's broken connection can tell the coordinator
// so soon that it died; and the idle agent that gets the next attempt hears of it through
// its Watch stream, not at its next heartbeat 5 s later.
TEST_F(ControlPlaneTest, AgentKilledIsNoticedByItsConnectionAndIdleAgentsAreNudged) {
  StartCluster(2, 1, /*heartbeat_interval_ms=*/5000, /*heartbeat_timeout_ms=*/20000);
  // Progress reaches the coordinator with heartbeats, 5 s apart here: the agents' logs say
  // when they started a trainer.
  auto started = [&](const std::string& id, int attempt) {
    for (const char* node : {"w0", "w1"}) {
      const std::string log = ReadAll((cluster_->root() / (std::string(node) + ".log")).string());
      if (log.find("starting trainer job " + id + " attempt " + std::to_string(attempt)) !=
          std::string::npos) {
        return true;
      }
    }
    return false;
  };
  int64_t t0 = NowMs();
  std::string id = Submit(cluster_->JobYaml("conn", 1, 1, 100000, 5, 3, 30, "step_ms=20\n"));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(WaitUntil([&] { return started(id, 1); }, 15000)) << cluster_->DebugLogs();
  EXPECT_LT(NowMs() - t0, 2500) << "the start order waited for a heartbeat";
  v1::JobInfo running = WaitStep(id, 1, 1, 15000);
  const std::string victim = running.job().placement(0).node();
  t0 = NowMs();
  cluster_->agent(victim)->Kill(SIGKILL);
  ASSERT_TRUE(WaitUntil([&] { return started(id, 2); }, 25000)) << cluster_->DebugLogs();
  EXPECT_LT(NowMs() - t0, 3000) << cluster_->DebugLogs();
  v1::JobInfo info = WaitStep(id, 1, 1, 15000);
  EXPECT_EQ(info.job().attempt(), 2);
  EXPECT_NE(info.job().placement(0).node(), victim);
  ASSERT_TRUE(cluster_->Cancel(id).ok());
}

// A person's typos get the nearest command, and --version works (no coordinator needed).
TEST(CliTest, MistypedCommandGetsTheNearestOneAndVersionWorks) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("drover_cli_typo_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  CliResult typo = RunCli(dir, {"jbos"});
  EXPECT_EQ(typo.code, 2);
  EXPECT_NE(typo.out.find("'jbos' is not a drover command; did you mean 'jobs'?"),
            std::string::npos)
      << typo.out;
  CliResult far = RunCli(dir, {"--coordinator", "127.0.0.1:1", "frobnicate"});
  EXPECT_EQ(far.code, 2);
  EXPECT_NE(far.out.find("'frobnicate' is not a drover command (drover --help"), std::string::npos)
      << far.out;
  CliResult version = RunCli(dir, {"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_NE(version.out.find("drover 0."), std::string::npos) << version.out;
  std::filesystem::remove_all(dir);
}

// One build serves both kinds of node: asked for GPUs where the driver has none, the agent
// refuses to start and says why (skipped on a machine whose GPUs it would find).
TEST(WorkerDeviceTest, CudaOnANodeWithoutAUsableGpuRefusesToStartWithTheReason) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("drover_cuda_probe_" + std::to_string(getpid()));
  const std::string log = (dir / "worker.log").string();
  std::filesystem::create_directories(dir);
  int ws = 0;
  bool exited = false;
  {
    Process p(Cluster::Bin("drover-worker"),
              {"--coordinator", "127.0.0.1:1", "--name", "gpu0", "--device", "cuda", "--work-dir",
               (dir / "work").string()},
              log);
    exited = p.Wait(5000, &ws);  // one that found GPUs keeps trying to reach 127.0.0.1:1
  }
  const std::string out = ReadAll(log);
  std::filesystem::remove_all(dir);
  if (!exited) GTEST_SKIP() << "this machine has a usable GPU";
  EXPECT_TRUE(WIFEXITED(ws) && WEXITSTATUS(ws) == 2) << out;
  EXPECT_NE(out.find("drover-worker: --device cuda: "), std::string::npos) << out;
}

// Two agents given one --name (other machines, other work dirs) must not take turns at
// being that node; a restarted agent of the node (same work dir) takes its name back.
TEST_F(ControlPlaneTest, SecondAgentWithALiveNodesNameIsRefused) {
  StartCluster(1);
  const std::string log = (cluster_->root() / "namesake.log").string();
  {
    Process namesake(Cluster::Bin("drover-worker"),
                     {"--coordinator", cluster_->address(), "--name", "w0", "--slots", "3",
                      "--device", "cpu", "--work-dir", (cluster_->root() / "namesake").string(),
                      "--trainer", Cluster::Bin("drover-fake-trainer")},
                     log);
    ASSERT_TRUE(WaitUntil(
        [&] { return ReadAll(log).find("is held by a live agent") != std::string::npos; }, 10000))
        << ReadAll(log);
    auto workers = cluster_->ListWorkers();
    ASSERT_TRUE(workers.ok());
    ASSERT_EQ(workers->workers_size(), 1);
    EXPECT_EQ(workers->workers(0).node().slots_size(), 1);  // w0's own, not the namesake's 3
    EXPECT_EQ(workers->workers(0).node().state(), v1::NODE_ALIVE);
  }
  // A second agent on w0's own work dir is refused before it registers at all.
  const std::string twin_log = (cluster_->root() / "twin.log").string();
  Process twin(Cluster::Bin("drover-worker"),
               {"--coordinator", cluster_->address(), "--name", "w0", "--slots", "1", "--device",
                "cpu", "--work-dir", (cluster_->root() / "w0").string(), "--trainer",
                Cluster::Bin("drover-fake-trainer")},
               twin_log);
  int ws = 0;
  ASSERT_TRUE(twin.Wait(10000, &ws));
  EXPECT_EQ(WEXITSTATUS(ws), 2) << ReadAll(twin_log);
  EXPECT_NE(ReadAll(twin_log).find("another drover-worker runs with --work-dir"), std::string::npos)
      << ReadAll(twin_log);
  // w0's agent, killed and restarted on its own work dir, is w0 again at once (it need not
  // wait for the old one to be declared dead).
  auto before = cluster_->ListWorkers();
  ASSERT_TRUE(before.ok());
  const std::string old_agent = before->workers(0).node().agent_id();
  cluster_->agent("w0")->Kill(SIGKILL);
  cluster_->StartAgent(0);
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto w = cluster_->ListWorkers();
        return w.ok() && w->workers_size() == 1 && w->workers(0).node().agent_id() != old_agent;
      },
      10000))
      << cluster_->DebugLogs();
}

TEST_F(ControlPlaneTest, CoordinatorKilledAndRestartedLeavesTrainersUndisturbed) {
  StartCluster(2);
  std::string id = Submit(cluster_->JobYaml("ckill", 2, 2, 50, 5, 3, 30, "step_ms=40\n"));
  ASSERT_FALSE(id.empty());
  v1::JobInfo running = WaitStep(id, 5, 2, 15000);
  std::vector<pid_t> pids = TrainerPids(running);
  ASSERT_EQ(pids.size(), 2u);
  cluster_->coordinator()->Kill(SIGKILL);
  // While it is away the trainers keep training.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (pid_t pid : pids) EXPECT_TRUE(ProcessAlive(pid)) << pid;
  cluster_->StartCoordinator();
  v1::JobInfo info = WaitEnd(id, 20000);
  ASSERT_EQ(info.job().state(), v1::SUCCEEDED) << Describe(info);
  EXPECT_EQ(info.job().attempt(), 1) << Describe(info);
  EXPECT_EQ(info.job().restarts(), 0);
}

// A trainer's rendezvous client (checkpoint reports, leases) reaches a coordinator killed
// outright and restarted as soon as a fresh client can. Its calls while the coordinator was
// away failed Unavailable; before, gRPC's reconnect back-off on that channel then refused
// calls for 5-15 s more (Connection refused, with the coordinator listening), long enough
// for a checkpoint report to be lost and the attempt to fail (found by drover-soak).
TEST(RendezvousClientTest, ReachesACoordinatorKilledAndRestartedAtOnce) {
  ClusterOptions o;
  o.agents = 0;
  o.name = "rendezvous-restart";
  Cluster cluster(o);
  cluster.StartCoordinator();
  // Any answer but Unavailable is the coordinator's (no such job: NotFound).
  auto reached = [](RendezvousClient& client) {
    return client.Set("k", "v").code() != StatusCode::kUnavailable;
  };
  RendezvousClient client(cluster.address(), "j-none", 1, /*rpc_timeout_ms=*/5000);
  ASSERT_TRUE(WaitUntil([&] { return reached(client); }, 10000)) << cluster.DebugLogs();
  cluster.coordinator()->Kill(SIGKILL);
  for (int i = 0; i < 20; ++i) {  // a second of calls while it is away
    EXPECT_EQ(client.Set("k", "v").code(), StatusCode::kUnavailable);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  cluster.StartCoordinator();
  ASSERT_TRUE(WaitUntil(
      [&] {
        RendezvousClient fresh(cluster.address(), "j-none", 1, 5000);
        return reached(fresh);
      },
      10000, 10))
      << cluster.DebugLogs();
  const int64_t back_ms = NowMs();
  ASSERT_TRUE(WaitUntil([&] { return reached(client); }, 20000, 10));
  EXPECT_LT(NowMs() - back_ms, 500) << "the client kept failing after the coordinator was back";
}

// The coordinator's own disk fills (a file-size limit on its process stands in for a full
// disk). Submits it cannot write are refused, with the reason, and never listed; a change
// it cannot refuse (a trainer died) stops it, naming its state dir. Restarted with room, it
// lists exactly the jobs it accepted and recovers the job from what its disk says.
TEST_F(ControlPlaneTest, CoordinatorWhoseDiskFillsRefusesSubmitsThenStops) {
  ClusterOptions o;
  o.agents = 1;
  o.name = "diskfull";
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator(/*max_file_kb=*/256);
  cluster_->StartAgent(0);
  ASSERT_TRUE(cluster_->WaitForAliveWorkers(1, 10000)) << cluster_->DebugLogs();
  const std::string first =
      Submit(cluster_->JobYaml("first", 1, 1, 100000, 0, 3, 30, "step_ms=20\n"));
  ASSERT_FALSE(first.empty());
  std::vector<pid_t> pids = TrainerPids(WaitStep(first, 2, 1, 15000));
  ASSERT_EQ(pids.size(), 1u);

  // The queued jobs cannot start (the one slot is taken): each submit writes one record.
  const std::string queued = cluster_->JobYaml("queued", 1, 1, 10, 0, 3, 30, "step_ms=20\n");
  int accepted = 1;
  Status refused;
  for (int i = 0; i < 1000 && refused.ok(); ++i) {
    auto id = cluster_->Submit(queued);
    if (id.ok()) {
      ++accepted;
    } else {
      refused = id.status();
    }
  }
  ASSERT_FALSE(refused.ok()) << "the state store never filled";
  EXPECT_NE(refused.message().find("job not submitted: cannot record it in " +
                                   cluster_->state_dir() + "/state.db"),
            std::string::npos)
      << refused;
  auto listed = cluster_->ListJobs();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->jobs_size(), accepted);
  ASSERT_TRUE(cluster_->coordinator()->running());

  // The trainer dies: the job must recover, which the coordinator cannot refuse nor write.
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  int ws = 0;
  ASSERT_TRUE(cluster_->coordinator()->Wait(10000, &ws)) << cluster_->DebugLogs();
  ASSERT_TRUE(WIFEXITED(ws)) << ws;
  EXPECT_EQ(WEXITSTATUS(ws), 1);
  const std::string log = ReadAll(cluster_->coordinator_log());
  EXPECT_NE(log.find("fail-stop: a state change already made in memory could not be written to " +
                     cluster_->state_dir() + "/state.db"),
            std::string::npos)
      << log.substr(log.size() > 3000 ? log.size() - 3000 : 0);

  // Room again: the restarted coordinator holds what its disk holds, no refused job, and
  // the exit is seen again (the agent lists it) and recovered.
  cluster_->StartCoordinator();
  ASSERT_TRUE(WaitUntil([&] { return cluster_->ListJobs().ok(); }, 10000)) << cluster_->DebugLogs();
  EXPECT_EQ(cluster_->ListJobs()->jobs_size(), accepted);
  v1::JobInfo info;
  EXPECT_TRUE(cluster_->WaitJob(
      first, [](const v1::JobInfo& i) { return i.job().attempt() >= 2 && i.job().restarts() == 1; },
      15000, &info))
      << Describe(info) << "\n"
      << cluster_->DebugLogs();
}

TEST_F(ControlPlaneTest, HangIsDetectedAndTheJobRestarted) {
  StartCluster(2);
  std::string id = Submit(
      cluster_->JobYaml("hang", 2, 2, 20, 5, 3, 1.0, "step_ms=30\nhang_at_step=7\nhang_rank=1\n"));
  ASSERT_FALSE(id.empty());
  v1::JobInfo info = WaitEnd(id, 20000);
  ASSERT_EQ(info.job().state(), v1::SUCCEEDED) << Describe(info);
  EXPECT_EQ(info.job().attempt(), 2) << Describe(info);
  EXPECT_EQ(info.job().restarts(), 1);
}

TEST_F(ControlPlaneTest, MaxRestartsIsHonoured) {
  StartCluster(2);
  std::string id = Submit(cluster_->JobYaml("crashy", 2, 2, 30, 0, 2, 30,
                                            "step_ms=20\ncrash_at_step=3\ncrash_attempt=0\n"));
  ASSERT_FALSE(id.empty());
  v1::JobInfo info = WaitEnd(id, 20000);
  ASSERT_EQ(info.job().state(), v1::FAILED) << Describe(info);
  EXPECT_EQ(info.job().restarts(), 2) << Describe(info);
  EXPECT_EQ(info.job().attempt(), 3) << Describe(info);
}

// A trainer that fails at once, every attempt: the first restart is immediate and goes to
// the other node; later ones wait longer each time, and the job says why it waits.
TEST_F(ControlPlaneTest, CrashingJobBacksOffAndMovesToTheOtherNode) {
  StartCluster(2);
  std::string id = Submit(cluster_->JobYaml("crashloop", 1, 1, 30, 0, 3, 30,
                                            "step_ms=20\ncrash_at_step=2\ncrash_attempt=0\n"));
  ASSERT_FALSE(id.empty());
  v1::JobInfo waiting;
  EXPECT_TRUE(cluster_->WaitJob(
      id,
      [](const v1::JobInfo& i) {
        return i.job().reason().find("restarting in") != std::string::npos;
      },
      15000, &waiting))
      << Describe(waiting);
  EXPECT_NE(waiting.job().reason().find("failures in a row"), std::string::npos)
      << Describe(waiting);
  v1::JobInfo info = WaitEnd(id, 30000);
  ASSERT_EQ(info.job().state(), v1::FAILED) << Describe(info);
  ASSERT_EQ(info.attempts_size(), 4) << Describe(info);
  EXPECT_NE(info.attempts(1).placement(0).node(), info.attempts(0).placement(0).node())
      << Describe(info);
  auto gap_ms = [&](int k) {
    return info.attempts(k).started_ms() - info.attempts(k - 1).ended_ms();
  };
  EXPECT_LT(gap_ms(1), 1000) << Describe(info);
  EXPECT_GE(gap_ms(2), 1000) << Describe(info);
  EXPECT_GE(gap_ms(3), 2000) << Describe(info);
}

TEST_F(ControlPlaneTest, CancelStopsEveryProcessOfTheJob) {
  StartCluster(2);
  // The trainers ignore SIGTERM: only the SIGKILL escalation can stop them.
  std::string id =
      Submit(cluster_->JobYaml("cancel", 2, 2, 100000, 0, 3, 30, "step_ms=20\nignore_sigterm=1\n"));
  ASSERT_FALSE(id.empty());
  v1::JobInfo running = WaitStep(id, 3, 2, 15000);
  std::vector<pid_t> pids = TrainerPids(running);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_TRUE(cluster_->Cancel(id).ok());
  v1::JobInfo info = WaitEnd(id, 10000);
  EXPECT_EQ(info.job().state(), v1::CANCELLED) << Describe(info);
  for (pid_t pid : pids) EXPECT_TRUE(WaitUntil([&] { return !ProcessAlive(pid); }, 5000)) << pid;
}

}  // namespace
}  // namespace drover::testing
