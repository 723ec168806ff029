// drover-goodput: effective training time under failures. Runs a real 2-rank data-parallel
// job (ZeRO-1, a small model, a checkpoint every --ckpt-every steps) on three one-slot
// agents at the default timing for --minutes, and every --every-s seconds kills something:
// in turn a trainer (kill -9), an agent (kill -9, restarted at once) and a node (its agent
// SIGSTOPped until the coordinator has moved the job, then killed and restarted).
//
// Productive time is the step time (step_ms) of the steps the finished run keeps: a step
// redone after a failure counts once, the lost one not at all. It is printed against the
// wall time from the job's first step to its last, for the whole run and for its first
// failure-free stretch (the job's own overhead: data, logging, checkpoints). A
// measurement, not a test: it asserts nothing.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "common/token_shard.h"
#include "tests/integration/cluster.h"

using drover::testing::Cluster;
using drover::testing::ClusterOptions;
using drover::testing::NowMs;
using drover::testing::WaitUntil;

namespace {

struct Line {
  int64_t step = 0;
  double step_ms = 0;
  int64_t attempt = 0;
};

double Field(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\":");
  return at == std::string::npos ? 0 : std::stod(line.substr(at + key.size() + 3));
}

std::vector<Line> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<Line> out;
  for (std::string l; std::getline(in, l);) {
    if (l.find("\"step_ms\":") == std::string::npos) continue;
    out.push_back({static_cast<int64_t>(Field(l, "step")), Field(l, "step_ms"),
                   static_cast<int64_t>(Field(l, "attempt"))});
  }
  return out;
}

std::string JobYaml(const Cluster& cluster, int ckpt_every) {
  const auto data = cluster.root() / "train.bin";
  std::mt19937_64 rng(3);
  std::vector<uint16_t> tokens(2000000);
  for (auto& t : tokens) t = static_cast<uint16_t>(rng() % 256);
  (void)drover::WriteTokenShard(data.string(), tokens);
  return "name: goodput\noutput_dir: " + (cluster.root() / "out").string() +
         "\nmodel: {n_layer: 4, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256}\n"
         "data: {train: " +
         data.string() +
         "}\n"
         "train: {steps: 100000000, global_batch: 16, micro_batch: 8, seq_len: 64, "
         "eval_every: 0}\n"
         "checkpoint: {every_steps: " +
         std::to_string(ckpt_every) +
         "}\n"
         "parallel: {zero_stage: 1}\n"
         "resources: {world_size: {min: 2, max: 2}, threads_per_rank: 1}\n"
         "fault_tolerance: {max_restarts: 100}\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"drover-goodput: productive step time against wall time under failures"};
  double minutes = 10;
  double every_s = 120;
  int ckpt_every = 50;
  app.add_option("--minutes", minutes, "how long the job runs")->capture_default_str();
  app.add_option("--every-s", every_s, "seconds between failures")->capture_default_str();
  app.add_option("--ckpt-every", ckpt_every, "checkpoint interval in steps")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  ClusterOptions o;
  o.agents = 3;
  o.heartbeat_interval_ms = 1000;
  o.heartbeat_timeout_ms = 3000;
  o.stop_grace_ms = 5000;
  o.agent_stop_grace_ms = 5000;
  o.trainer = "drover-trainer";
  o.name = "goodput";
  Cluster cluster(o);
  if (!cluster.Start(15000)) {
    std::fprintf(stderr, "workers did not register\n%s", cluster.DebugLogs().c_str());
    return 1;
  }
  auto id = cluster.Submit(JobYaml(cluster, ckpt_every));
  if (!id.ok()) {
    std::fprintf(stderr, "submit: %s\n", id.status().ToString().c_str());
    return 1;
  }
  const std::string metrics = (cluster.root() / "out" / "metrics.jsonl").string();
  if (!WaitUntil([&] { return !ReadLines(metrics).empty(); }, 60000)) {
    std::fprintf(stderr, "the job did not start\n%s", cluster.DebugLogs().c_str());
    return 1;
  }
  const int64_t start = NowMs();
  const int64_t end = start + static_cast<int64_t>(minutes * 60000);
  int64_t first_fault_ms = -1;
  for (int fault = 0;; ++fault) {
    const int64_t at = start + static_cast<int64_t>((fault + 1) * every_s * 1000);
    if (at >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(at - NowMs()));
    if (first_fault_ms < 0) first_fault_ms = NowMs() - start;
    auto info = cluster.GetJob(*id);
    if (!info.ok() || info->job().placement_size() < 2) {
      std::printf("fault %d skipped: the job is not running\n", fault);
      continue;
    }
    const std::string node = info->job().placement(1).node();
    const int index = std::stoi(node.substr(1));
    const char* kinds[] = {"trainer", "agent", "node"};
    const char* kind = kinds[fault % 3];
    if (fault % 3 == 0) {
      for (const auto& t : info->trainers()) {
        if (t.rank() == 1 && t.attempt() == info->job().attempt()) kill(t.pid(), SIGKILL);
      }
    } else if (fault % 3 == 1) {
      cluster.agent(node)->Kill(SIGKILL);
      cluster.StartAgent(index);
    } else {
      const int64_t attempt = info->job().attempt();
      cluster.agent(node)->Kill(SIGSTOP);
      cluster.WaitJob(
          *id, [&](const drover::v1::JobInfo& i) { return i.job().attempt() > attempt; }, 30000);
      cluster.agent(node)->Kill(SIGKILL);
      cluster.StartAgent(index);
    }
    std::printf("%6.1f s: killed the %s of rank 1 (%s)\n", (NowMs() - start) / 1000.0, kind,
                node.c_str());
    std::fflush(stdout);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(0, end - NowMs())));
  (void)cluster.Cancel(*id);
  const int64_t wall_ms = NowMs() - start;

  // The steps the run keeps: for each step number, the newest attempt's line.
  const std::vector<Line> lines = ReadLines(metrics);
  std::map<int64_t, Line> kept;
  for (const Line& l : lines) {
    auto it = kept.find(l.step);
    if (it == kept.end() || l.attempt >= it->second.attempt) kept[l.step] = l;
  }
  // A step an attempt did past its last checkpoint was lost and redone by the next one:
  // only the redo counts.
  double productive_ms = 0;
  for (const auto& [step, l] : kept) productive_ms += l.step_ms;
  auto info = cluster.GetJob(*id);
  const int attempts = info.ok() ? static_cast<int>(info->job().attempt()) : -1;
  std::printf(
      "%.1f min, %zu metrics lines, %zu steps kept, %d attempts: productive step time %.1f s of "
      "%.1f s wall = %.1f%%\n",
      wall_ms / 60000.0, lines.size(), kept.size(), attempts, productive_ms / 1000.0,
      wall_ms / 1000.0, 100.0 * productive_ms / wall_ms);
  // The failure-free stretch before the first fault: the job's own overhead.
  if (first_fault_ms > 0) {
    double free_ms = 0;
    int64_t steps = 0;
    for (const Line& l : lines) {
      if (l.attempt != 1) break;
      free_ms += l.step_ms;
      ++steps;
    }
    std::printf(
        "before the first failure (attempt 1, %lld steps): productive %.1f s of about %.1f s = "
        "%.1f%%\n",
        static_cast<long long>(steps), free_ms / 1000.0, first_fault_ms / 1000.0,
        100.0 * free_ms / first_fault_ms);
  }
  return 0;
}
