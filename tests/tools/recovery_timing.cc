// drover-recovery-timing: measures recovery from a failure at the default timing
// (heartbeat 1 s, node timeout 3 s) unless flags say otherwise.
//
// Runs a coordinator, three one-slot agents and a 2-rank job (the scripted fake trainer, or
// with --real the real drover-trainer on a small model, data parallel or --mode pp2), then
// --fault:
//   trainer     kill -9 of rank 1's trainer process;
//   agent       kill -9 of rank 1's agent (default);
//   silent      SIGSTOP of rank 1's agent (a silent node: only the heartbeat timeout finds it);
// and prints the time from the fault to (a) the coordinator ending the attempt (detection),
// (b) every surviving trainer of the old attempt having exited, and (c) the new attempt's
// first step. A measurement, not a test: it asserts nothing about the numbers.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <random>

#include "common/token_shard.h"
#include "tests/integration/cluster.h"

using drover::testing::Cluster;
using drover::testing::ClusterOptions;
using drover::testing::NowMs;
using drover::testing::ProcessAlive;
using drover::testing::WaitUntil;

namespace {

struct Setup {
  bool real = false;
  std::string mode = "dp2";
  std::string fault = "agent";
};

// A small real job: 2 ranks, data parallel (ZeRO-1) or a 2-stage pipeline, a checkpoint
// every 20 steps, far more steps than the measurement needs.
std::string RealJobYaml(const Cluster& cluster, const std::string& mode) {
  const auto data = cluster.root() / "train.bin";
  std::mt19937_64 rng(3);
  std::vector<uint16_t> tokens(200000);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 64);
  (void)drover::WriteTokenShard(data.string(), tokens);
  return "name: timing\noutput_dir: " + (cluster.root() / "out").string() +
         "\nmodel: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 64}\n"
         "data: {train: " +
         data.string() +
         "}\n"
         "train: {steps: 100000, global_batch: 8, micro_batch: 2, seq_len: 32, eval_every: 0}\n"
         "checkpoint: {every_steps: 20}\n" +
         (mode == "pp2" ? "parallel: {pp: 2}\n" : "parallel: {zero_stage: 1}\n") +
         "resources: {world_size: {min: 2, max: 2}, threads_per_rank: 1}\n"
         "fault_tolerance: {max_restarts: 5}\n";
}

int RunOnce(const ClusterOptions& options, const Setup& setup, int run) {
  ClusterOptions o = options;
  o.name = "timing" + std::to_string(run);
  if (setup.real) o.trainer = "drover-trainer";
  Cluster cluster(o);
  if (!cluster.Start(15000)) {
    std::fprintf(stderr, "workers did not register\n%s", cluster.DebugLogs().c_str());
    return 1;
  }
  auto id = cluster.Submit(
      setup.real ? RealJobYaml(cluster, setup.mode)
                 : cluster.JobYaml("timing", 2, 2, 100000, 20, 5, 60, "step_ms=50\n"));
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
  pid_t victim_trainer = -1;
  for (const auto& t : info.trainers()) {
    if (t.rank() != 1) survivors.push_back(t.pid());
    if (t.rank() == 1) victim_trainer = t.pid();
  }
  const int64_t t0 = NowMs();
  if (setup.fault == "trainer") {
    kill(victim_trainer, SIGKILL);
  } else {
    cluster.agent(victim)->Kill(setup.fault == "silent" ? SIGSTOP : SIGKILL);
  }
  int64_t detected_ms = -1;
  int64_t stopped_ms = -1;
  int64_t progress_ms = -1;
  WaitUntil(
      [&] {
        const int64_t now = NowMs();
        if (detected_ms < 0) {
          auto i = cluster.GetJob(*id);
          if (i.ok() &&
              (i->job().attempt() > old_attempt || i->job().state() != drover::v1::RUNNING)) {
            detected_ms = now - t0;
          }
        }
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
  if (setup.fault == "silent") cluster.agent(victim)->Kill(SIGKILL);  // SIGSTOPped: cannot exit
  std::printf(
      "run %d: %s %s of rank 1 (%s) -> detected after %lld ms, survivors stopped after %lld ms, "
      "new attempt's first step after %lld ms\n",
      run, setup.real ? ("real " + setup.mode).c_str() : "fake-trainer", setup.fault.c_str(),
      victim.c_str(), static_cast<long long>(detected_ms), static_cast<long long>(stopped_ms),
      static_cast<long long>(progress_ms));
  std::fflush(stdout);
  return stopped_ms >= 0 && progress_ms >= 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"drover-recovery-timing: inject a failure into a 2-rank job and time the recovery"};
  ClusterOptions options;
  options.agents = 3;
  options.heartbeat_interval_ms = 1000;
  options.heartbeat_timeout_ms = 3000;
  options.stop_grace_ms = 5000;
  options.agent_stop_grace_ms = 5000;
  int runs = 3;
  Setup setup;
  app.add_flag("--real", setup.real, "run drover-trainer on a small model, not the fake trainer");
  app.add_option("--mode", setup.mode, "with --real: dp2 (ZeRO-1) or pp2")
      ->check(CLI::IsMember({"dp2", "pp2"}))
      ->capture_default_str();
  app.add_option("--fault", setup.fault,
                 "trainer, agent (kill -9) or silent (SIGSTOP of the agent)")
      ->check(CLI::IsMember({"trainer", "agent", "silent"}))
      ->capture_default_str();
  app.add_option("--heartbeat-interval-ms", options.heartbeat_interval_ms)->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", options.heartbeat_timeout_ms)->capture_default_str();
  app.add_option("--stop-grace-ms", options.stop_grace_ms)->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  int rc = 0;
  for (int r = 0; r < runs; ++r) rc |= RunOnce(options, setup, r);
  return rc;
}
