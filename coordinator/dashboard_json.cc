#include "coordinator/dashboard_json.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "common/duration.h"
#include "common/job_spec.h"
#include "common/job_state.h"

namespace drover::coordinator {
namespace {

using nlohmann::json;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// JSON has no NaN or infinity: a diverged loss is shown as missing, not as garbage.
json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string NodeState(const v1::NodeRecord& n, int64_t now_ms) {
  if (n.state() == v1::NODE_DEAD) return "dead";
  if (n.state() == v1::NODE_CORDONED || n.cordon_until_ms() > now_ms) return "cordoned";
  return "alive";
}

json JobSummary(const v1::JobRecord& j) {
  return json{{"job_id", j.job_id()},
              {"name", j.name()},
              {"state", Lower(v1::JobState_Name(j.state()))},
              {"attempt", j.attempt()},
              {"restarts", j.restarts()},
              {"max_restarts", j.max_restarts()},
              {"world_size", j.placement_size()},
              {"device", Lower(v1::DeviceKind_Name(j.device()))},
              {"step", j.last_step()},
              {"loss", Number(j.last_loss())},
              {"tokens_per_s", Number(j.tokens_per_s())},
              {"latest_checkpoint_step", j.latest_checkpoint_step()},
              {"submitted_ms", j.submitted_ms()},
              {"started_ms", j.started_ms()},
              {"finished_ms", j.finished_ms()},
              {"reason", j.reason()}};
}

json Placement(const v1::JobInfo& info) {
  std::map<int, const v1::TrainerStatus*> by_rank;
  for (const v1::TrainerStatus& t : info.trainers()) {
    if (t.attempt() == info.job().attempt()) by_rank[t.rank()] = &t;
  }
  json ranks = json::array();
  for (const v1::RankAssignment& r : info.job().placement()) {
    json rank{
        {"rank", r.rank()}, {"node", r.node()}, {"slot", r.slot()}, {"local_rank", r.local_rank()}};
    if (auto it = by_rank.find(r.rank()); it != by_rank.end()) {
      const v1::TrainerStatus& t = *it->second;
      rank["state"] = Lower(v1::TrainerState_Name(t.state()).substr(8));  // "TRAINER_"
      rank["pid"] = t.pid();
      rank["step"] = t.progress().step();
      rank["step_ms"] = Number(t.progress().step_ms());
      if (t.progress().busy_ms() > 0) rank["busy_ms"] = Number(t.progress().busy_ms());
      rank["message"] = t.progress().message();
    } else {
      rank["state"] = "not started";
    }
    rank["straggler"] = std::find(info.straggler_ranks().begin(), info.straggler_ranks().end(),
                                  r.rank()) != info.straggler_ranks().end();
    ranks.push_back(std::move(rank));
  }
  return ranks;
}

json Attempts(const v1::JobInfo& info, const ProgressHistory::Series& history) {
  // The first step each attempt reported, as far as the history holds it: a restart is
  // placed at once, but training again is what a person waits for.
  std::map<int64_t, int64_t> first_step_ms;
  for (const ProgressPoint& p : history.points) first_step_ms.emplace(p.attempt, p.time_ms);
  json attempts = json::array();
  for (int i = 0; i < info.attempts_size(); ++i) {
    const v1::AttemptRecord& a = info.attempts(i);
    json nodes = json::array();
    for (const v1::RankAssignment& r : a.placement()) {
      if (std::find(nodes.begin(), nodes.end(), r.node()) == nodes.end()) nodes.push_back(r.node());
    }
    json attempt{{"attempt", a.attempt()},       {"world_size", a.world_size()},
                 {"started_ms", a.started_ms()}, {"ended_ms", a.ended_ms()},
                 {"end_reason", a.end_reason()}, {"resume_step", a.resume_step()},
                 {"nodes", std::move(nodes)}};
    // Recovery: from the previous attempt's end to this one's start.
    if (i > 0 && info.attempts(i - 1).ended_ms() > 0 &&
        a.started_ms() >= info.attempts(i - 1).ended_ms()) {
      attempt["recovery_ms"] = a.started_ms() - info.attempts(i - 1).ended_ms();
      if (auto it = first_step_ms.find(a.attempt());
          it != first_step_ms.end() && it->second >= info.attempts(i - 1).ended_ms()) {
        attempt["training_again_ms"] = it->second - info.attempts(i - 1).ended_ms();
      }
    }
    attempts.push_back(std::move(attempt));
  }
  return attempts;
}

json History(const ProgressHistory::Series& h) {
  // Arrays, not objects: 2,000 points poll every second or two.
  json points = json::array();
  for (const ProgressPoint& p : h.points) {
    points.push_back(json::array({p.attempt, p.step, p.time_ms, Number(p.loss), Number(p.lr),
                                  Number(p.tokens_per_s), Number(p.mfu)}));
  }
  json evals = json::array();
  auto maybe = [](const std::optional<double>& v) { return v ? Number(*v) : json(nullptr); };
  for (const EvalPoint& e : h.evals) {
    evals.push_back(
        json::array({e.attempt, e.step, e.time_ms, maybe(e.val_loss), maybe(e.hellaswag)}));
  }
  return json{{"memory_only", true},
              {"stride", h.stride},
              {"reports", h.reports},
              {"columns", {"attempt", "step", "time_ms", "loss", "lr", "tokens_per_s", "mfu"}},
              {"eval_columns", {"attempt", "step", "time_ms", "val_loss", "hellaswag"}},
              {"points", std::move(points)},
              {"evals", std::move(evals)}};
}

}  // namespace

json ClusterJson(const v1::ListWorkersResponse& workers, const v1::ListJobsResponse& running,
                 int64_t now_ms) {
  // (node, slot) -> the rank of a running job that holds it.
  std::map<std::pair<std::string, int>, std::pair<const v1::JobRecord*, int>> holder;
  for (const v1::JobRecord& j : running.jobs()) {
    if (j.state() != v1::RUNNING) continue;
    for (const v1::RankAssignment& r : j.placement()) holder[{r.node(), r.slot()}] = {&j, r.rank()};
  }
  json nodes = json::array();
  int64_t slots = 0, free = 0, alive = 0;
  for (const v1::WorkerInfo& w : workers.workers()) {
    const v1::NodeRecord& n = w.node();
    json node_slots = json::array();
    for (const v1::Slot& s : n.slots()) {
      json slot{{"index", s.index()},
                {"device", Lower(v1::DeviceKind_Name(s.device()))},
                {"description", s.description()}};
      if (auto it = holder.find({n.name(), s.index()}); it != holder.end()) {
        slot["job_id"] = it->second.first->job_id();
        slot["job_name"] = it->second.first->name();
        slot["rank"] = it->second.second;
      }
      for (const v1::SlotFault& f : n.slot_faults()) {
        if (f.slot() != s.index()) continue;
        slot["failures"] = f.failures();
        if (f.slow() > 0) slot["slow"] = f.slow();  // of those, cordons as a straggler's
        slot["fault"] = f.reason();
        if (f.cordon_until_ms() > now_ms) slot["cordon_until_ms"] = f.cordon_until_ms();
        // Out of use by an operator's word (drover cordon --slot) until uncordoned.
        if (!f.operator_cordon().empty()) slot["operator_cordon"] = f.operator_cordon();
      }
      for (const v1::SlotHealth& h : n.unhealthy_slots()) {
        if (h.slot() == s.index()) slot["unfit"] = h.fault();  // out while its agent says so
      }
      for (const v1::GpuTelemetry& g : w.gpus()) {
        if (g.slot() != s.index()) continue;
        json gpu{{"memory_used_bytes", g.memory_used_bytes()},
                 {"memory_total_bytes", g.memory_total_bytes()},
                 {"slowdown", g.slowdown()}};
        if (g.has_utilization_pct()) gpu["utilization_pct"] = g.utilization_pct();
        if (g.has_temperature_c()) gpu["temperature_c"] = g.temperature_c();
        if (g.has_power_mw()) gpu["power_w"] = g.power_mw() / 1000.0;
        slot["gpu"] = std::move(gpu);
      }
      node_slots.push_back(std::move(slot));
    }
    const std::string state = NodeState(n, now_ms);
    alive += state == "alive";
    slots += n.slots_size();
    free += w.free_slots();
    json node{{"name", n.name()},
              {"address", n.address()},
              {"state", state},
              {"failures", n.failures()},
              {"last_failure_ms", n.last_failure_ms()},
              {"cordon_until_ms", n.cordon_until_ms()},
              {"heartbeat_age_ms", std::max<int64_t>(0, now_ms - n.last_heartbeat_ms())},
              {"free_slots", w.free_slots()},
              {"trainers", w.trainers_size()},
              {"slots", std::move(node_slots)}};
    // Out of service by an operator's word (drover cordon, drover drain) until uncordoned.
    if (!n.operator_cordon().empty()) node["operator_cordon"] = n.operator_cordon();
    if (w.draining()) node["draining"] = true;  // its trainers leave with checkpoints
    nodes.push_back(std::move(node));
  }
  return json{{"now_ms", now_ms},
              {"nodes", std::move(nodes)},
              {"totals",
               {{"nodes", workers.workers_size()},
                {"alive", alive},
                {"slots", slots},
                {"free_slots", free}}}};
}

json JobsJson(const v1::ListJobsResponse& jobs) {
  json list = json::array();
  for (const v1::JobRecord& j : jobs.jobs()) list.push_back(JobSummary(j));
  return json{{"jobs", std::move(list)}, {"next_before_seq", jobs.next_before_seq()}};
}

json JobJson(const v1::JobInfo& info, const ProgressHistory::Series& history, int64_t now_ms) {
  const v1::JobRecord& j = info.job();
  json job = JobSummary(j);
  auto spec = ParseJobSpec(j.spec_yaml(), {}, "job " + j.job_id());
  job["steps"] = spec.ok() ? spec->train.steps : 0;
  if (spec.ok() && spec->resources.time_limit_minutes > 0) {
    // resources.time_limit_minutes and what the job's attempts have run of it.
    job["time_limit_ms"] = MinutesToMs(spec->resources.time_limit_minutes);
    job["time_used_ms"] = JobRanMs(info, now_ms);
  }
  job["output_dir"] = j.output_dir();
  job["checkpoint_error"] = j.checkpoint_error();
  json checkpoints = json::array();
  for (const v1::CheckpointRecord& c : info.checkpoints()) {
    checkpoints.push_back(json{{"step", c.step()},
                               {"attempt", c.attempt()},
                               {"created_ms", c.created_ms()},
                               {"world_size", c.world_size()}});
  }
  return json{{"now_ms", now_ms},
              {"job", std::move(job)},
              {"placement", Placement(info)},
              {"attempts", Attempts(info, history)},
              {"checkpoints", std::move(checkpoints)},
              {"notices", std::vector<std::string>(info.notices().begin(), info.notices().end())},
              {"history", History(history)}};
}

}  // namespace drover::coordinator
