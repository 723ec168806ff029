// drover-recovery-timing: measures recovery after `kill -9` of a worker agent, at the
// default timing (heartbeat 1 s, node timeout 3 s) unless flags say otherwise.
//
// Runs a coordinator, three agents (one slot each) and a 2-rank fake-trainer job; kills
// the agent of rank 1 and prints (a) the time until every surviving trainer of the old
// attempt has exited and (b) the time until the coordinator shows the new attempt's first
// progress report. A measurement, not a test: it asserts nothing about the numbers.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/cluster.h"

using drover::testing::Cluster;
using drover::testing::ClusterOptions;
using drover::testing::NowMs;
using drover::testing::ProcessAlive;
using drover::testing::WaitUntil;

namespace {

int RunOnce(const ClusterOptions& options, int run) {
  ClusterOptions o = options;
  o.name = "timing" + std::to_string(run);
  Cluster cluster(o);
  if (!cluster.Start(15000)) {
    std::fprintf(stderr, "workers did not register\n%s", cluster.DebugLogs().c_str());
    return 1;
  }
  auto id = cluster.Submit(cluster.JobYaml("timing", 2, 2, 100000, 20, 5, 60, "step_ms=50\n"));
  if (!id.ok()) {
    std::fprintf(stderr, "submit: %s\n", id.status().ToString().c_str());
    return 1;
  }
  drover::v1::JobInfo info;
  bool running = cluster.WaitJob(
      *id,
      [](const drover::v1::JobInfo& i) {
        int n = 0;
        for (const auto& t : i.trainers()) n += t.progress().step() >= 25;
        return i.job().state() == drover::v1::RUNNING && n == 2;
      },
      30000, &info);
  if (!running) {
    std::fprintf(stderr, "job did not start\n%s", cluster.DebugLogs().c_str());
    return 1;
  }
  const int64_t old_attempt = info.job().attempt();
  const std::string victim = info.job().placement(1).node();
  std::vector<pid_t> survivors;
  for (const auto& t : info.trainers()) {
    if (t.rank() != 1) survivors.push_back(t.pid());
  }
  const int64_t t0 = NowMs();
  cluster.agent(victim)->Kill(SIGKILL);
  int64_t stopped_ms = -1;
  int64_t progress_ms = -1;
  WaitUntil(
      [&] {
        const int64_t now = NowMs();
        if (stopped_ms < 0) {
          bool any = false;
          for (pid_t p : survivors) any = any || ProcessAlive(p);
          if (!any) stopped_ms = now - t0;
        }
        if (progress_ms < 0) {
          auto i = cluster.GetJob(*id);
          if (i.ok() && i->job().attempt() > old_attempt) {
            for (const auto& t : i->trainers()) {
              if (t.attempt() > old_attempt && t.state() == drover::v1::TRAINER_RUNNING &&
                  t.progress().step() > i->attempts().rbegin()->resume_step()) {
                progress_ms = now - t0;
              }
            }
          }
        }
        return stopped_ms >= 0 && progress_ms >= 0;
      },
      60000, 5);
  std::printf(
      "run %d: kill -9 of agent %s -> survivors stopped after %lld ms, new attempt's "
      "first progress after %lld ms\n",
      run, victim.c_str(), static_cast<long long>(stopped_ms), static_cast<long long>(progress_ms));
  std::fflush(stdout);
  return stopped_ms >= 0 && progress_ms >= 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"drover-recovery-timing: kill -9 an agent and time the recovery"};
  ClusterOptions options;
  options.agents = 3;
  options.heartbeat_interval_ms = 1000;
  options.heartbeat_timeout_ms = 3000;
  options.stop_grace_ms = 5000;
  options.agent_stop_grace_ms = 5000;
  int runs = 3;
  app.add_option("--heartbeat-interval-ms", options.heartbeat_interval_ms)->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", options.heartbeat_timeout_ms)->capture_default_str();
  app.add_option("--stop-grace-ms", options.stop_grace_ms)->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  int rc = 0;
  for (int r = 0; r < runs; ++r) rc |= RunOnce(options, r);
  return rc;
}
