#include "cli/top_view.h"

#include <algorithm>
#include <cstdio>

#include "cli/progress.h"
#include "cli/rpc_client.h"
#include "common/job_spec.h"
#include "common/node_slots.h"

namespace drover::cli {
namespace {

std::string Trimmed(const std::string& name, const std::string& prefix) {
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

std::string Fixed(const char* format, double value) {
  char buf[32];
  snprintf(buf, sizeof(buf), format, value);
  return buf;
}

bool IsLive(const v1::TrainerStatus& t) { return t.state() != v1::TRAINER_EXITED; }

// A GPU node's GPUs at a glance: "97% busy" (the mean of those NVML answered for), and
// ", 1 slowed" where the hardware holds some down; "-" for a node without readings.
std::string GpuSummary(const v1::WorkerInfo& w) {
  int answered = 0, busy = 0, slowed = 0;
  for (const v1::GpuTelemetry& g : w.gpus()) {
    if (g.has_utilization_pct()) {
      ++answered;
      busy += g.utilization_pct();
    }
    slowed += g.slowdown().empty() ? 0 : 1;
  }
  std::string summary = answered > 0 ? std::to_string((busy + answered / 2) / answered) + "% busy"
                                     : (w.gpus().empty() ? "-" : "busy ?");
  if (slowed > 0) summary += ", " + std::to_string(slowed) + " slowed";
  return summary;
}

std::string NodeTable(const TopSnapshot& s) {
  // The GPUS column only where some agent sends GPU readings: a CPU cluster's table is as it was.
  const bool gpus = std::any_of(s.workers.workers().begin(), s.workers.workers().end(),
                                [](const v1::WorkerInfo& w) { return w.gpus_size() > 0; });
  std::vector<std::vector<std::string>> rows;
  for (const v1::WorkerInfo& w : s.workers.workers()) {
    const v1::NodeRecord& n = w.node();
    const int used =
        static_cast<int>(std::count_if(w.trainers().begin(), w.trainers().end(), IsLive));
    // A node that never beat has no age to show; a clock step backwards shows 0.
    const std::string age =
        n.last_heartbeat_ms() > 0 ? FormatDurationMs(s.now_ms - n.last_heartbeat_ms()) : "-";
    // Slots whose GPU failed or fails its node's health check (SlotOut), by the coordinator's
    // clock (ListWorkersResponse.now_ms) where it sent one.
    const int64_t now = s.workers.now_ms() > 0 ? s.workers.now_ms() : s.now_ms;
    const int out = SlotsOut(n, now);
    rows.push_back({n.name(),
                    w.draining() ? "DRAINING" : Trimmed(v1::NodeState_Name(n.state()), "NODE_"),
                    std::to_string(used) + "/" + std::to_string(n.slots_size()) +
                        (out > 0 ? " (" + std::to_string(out) + " out)" : ""),
                    age});
    if (gpus) rows.back().push_back(GpuSummary(w));
  }
  if (rows.empty()) return "no worker nodes\n";
  std::vector<std::string> header = {"NODE", "STATE", "SLOTS", "HEARTBEAT"};
  if (gpus) header.push_back("GPUS");
  return FormatTable(header, rows);
}

// A running job's model FLOPs utilisation: rank 0's report, as `drover status` shows it; 0
// where its trainer does not know its device's peak (a CPU job, an unknown GPU) or the job
// is not running.
double RunningMfu(const v1::JobInfo& info) {
  const v1::JobRecord& j = info.job();
  if (j.state() != v1::RUNNING) return 0;
  for (const v1::TrainerStatus& t : info.trainers()) {
    if (t.rank() == 0 && t.attempt() == j.attempt() && t.state() == v1::TRAINER_RUNNING) {
      return t.progress().mfu();
    }
  }
  return 0;
}

// One job's row; sets *recomputed when its step is being trained again after a restart.
// `mfu_column`: the table has an MFU column, after TOK/S.
std::vector<std::string> JobRow(const v1::JobInfo& info, bool mfu_column, bool* recomputed) {
  const v1::JobRecord& j = info.job();
  auto spec = ParseJobSpec(j.spec_yaml(), {}, "job " + j.job_id());
  const int64_t steps = spec.ok() ? spec->train.steps : 0;
  const bool running = j.state() == v1::RUNNING;
  // The ETA goes at the pace of the slowest live rank of the current attempt.
  double step_ms = 0;
  for (const v1::TrainerStatus& t : info.trainers()) {
    if (running && t.attempt() == j.attempt() && t.state() == v1::TRAINER_RUNNING) {
      step_ms = std::max(step_ms, t.progress().step_ms());
    }
  }
  const bool again = j.last_step() < j.furthest_step();
  *recomputed = *recomputed || again;
  std::string step = std::to_string(j.last_step());
  if (steps > 0) {
    step += '/';  // appended apart: GCC 12 warns (-Wrestrict) on "/" + std::string
    step += std::to_string(steps);
  }
  if (again) step += "*";
  const bool has_step = j.last_step() > 0;
  std::string eta = "-";
  if (steps > 0 && j.last_step() >= steps) {
    eta = "done";
  } else if (running && steps > 0 && step_ms > 0) {
    eta = FormatDurationMs(
        static_cast<int64_t>(step_ms * static_cast<double>(steps - j.last_step())));
  }
  std::vector<std::string> row = {
      j.job_id(),
      j.name(),
      JobStateName(j.state()),
      std::to_string(j.attempt()),
      std::to_string(j.placement_size()),
      step,
      steps > 0 ? Fixed("%.1f%%", 100.0 * static_cast<double>(j.last_step()) / steps) : "-",
      has_step ? Fixed("%.4f", j.last_loss()) : "-",
      running && j.tokens_per_s() > 0 ? Fixed("%.0f", j.tokens_per_s()) : "-"};
  if (mfu_column) {
    const double mfu = RunningMfu(info);
    row.push_back(mfu > 0 ? Fixed("%.1f%%", 100.0 * mfu) : "-");
  }
  row.push_back(eta);
  return row;
}

std::string JobTable(const TopSnapshot& s) {
  if (s.jobs.empty()) return "no active jobs\n";
  // The MFU column only where some running job reports one: a CPU cluster's table is as it was.
  const bool mfu = std::any_of(s.jobs.begin(), s.jobs.end(),
                               [](const v1::JobInfo& info) { return RunningMfu(info) > 0; });
  std::vector<std::vector<std::string>> rows;
  bool recomputed = false;
  for (const v1::JobInfo& info : s.jobs) rows.push_back(JobRow(info, mfu, &recomputed));
  std::vector<std::string> header = {"JOB",  "NAME",     "STATE", "ATTEMPT", "WORLD",
                                     "STEP", "PROGRESS", "LOSS",  "TOK/S"};
  if (mfu) header.push_back("MFU");
  header.push_back("ETA");
  std::string out = FormatTable(header, rows);
  if (recomputed) out += "* recomputed after restart: the job trains again from its checkpoint\n";
  return out;
}

std::string Title(const TopSnapshot& s) {
  int alive = 0, slots = 0, used = 0;
  for (const v1::WorkerInfo& w : s.workers.workers()) {
    alive += w.node().state() == v1::NODE_ALIVE;
    slots += w.node().slots_size();
    used += static_cast<int>(std::count_if(w.trainers().begin(), w.trainers().end(), IsLive));
  }
  int by_state[v1::JobState_ARRAYSIZE] = {};
  for (const v1::JobInfo& info : s.jobs) ++by_state[info.job().state()];
  return "drover top - " + s.coordinator + " - nodes " + std::to_string(alive) + "/" +
         std::to_string(s.workers.workers_size()) + " alive, slots " + std::to_string(used) + "/" +
         std::to_string(slots) + " used - jobs " + std::to_string(by_state[v1::RUNNING]) +
         " running, " + std::to_string(by_state[v1::RECOVERING]) + " recovering, " +
         std::to_string(by_state[v1::PENDING]) + " pending" +
         (by_state[v1::SUSPENDED] > 0
              ? ", " + std::to_string(by_state[v1::SUSPENDED]) + " suspended"
              : std::string()) +
         "\n";
}

// Cuts every line of `text` to `width` characters, so that a narrow terminal does not wrap
// a table into unreadable pieces.
std::string CutLines(const std::string& text, int width) {
  if (width <= 0) return text;
  std::string out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (line.size() > static_cast<size_t>(width)) line.resize(static_cast<size_t>(width));
    // FormatTable pads columns; a cut line has no reason to end in blanks.
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string RenderTop(const TopSnapshot& snapshot, int width) {
  return CutLines(Title(snapshot) + "\n" + NodeTable(snapshot) + "\n" + JobTable(snapshot), width);
}

}  // namespace drover::cli
