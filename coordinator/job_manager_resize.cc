// JobManager's resizes (growth, shrink, preemption: job_manager.h), its replacements of
// stragglers, and the checkpoint requests that make them prompt.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "coordinator/job_manager.h"
#include "coordinator/straggler.h"

namespace drover::coordinator {
namespace {

// " for job J (priority P)": the job a resize makes room for, or "" when it grows.
std::string ForJob(const BlockedJob& j) {
  if (j.job_id.empty()) return "";
  return " for job " + j.job_id + " (priority " + std::to_string(j.priority) + ")";
}

// Where a shrink's estimate comes from: "as at 3 ranks without stragglers", or "85 ms at 4
// ranks without stragglers, times 4/2".
std::string Basis(const Shrink& s) {
  const std::string at = " at " + std::to_string(s.from_size) + " ranks without stragglers";
  if (s.from_size == s.world_size) return "as" + at;
  return std::to_string(std::llround(s.from_pace_ms)) + " ms" + at + ", times " +
         std::to_string(s.from_size) + "/" + std::to_string(s.world_size);
}

}  // namespace

std::vector<RunningJob> JobManager::Resizable() const {
  std::vector<RunningJob> out;
  for (const auto& [seq, id] : live_) {
    const Job& job = *Get(id);
    if (job.rec.state() != v1::RUNNING || job.feasible.empty()) continue;
    if (!job.spec.checkpoint.enabled() || job.rec.suspend() || job.time_up) continue;
    // A move planned (a straggler's, a drained slot's) ends the attempt at the checkpoint
    // asked for, and the next attempt's placement decides its size then.
    if (job.replace) continue;
    out.push_back(
        {id, job.rec.priority(), job.rec.submit_seq(), job.rec.device(), job.rec.placement_size(),
         job.feasible, job.spec.RankBlock(),
         std::vector<v1::RankAssignment>(job.rec.placement().begin(), job.rec.placement().end())});
  }
  return out;
}

bool JobManager::PlanResize(const std::string& job_id, std::optional<ResizePlan> plan) {
  Job* job = Get(job_id);
  if (!job || job->rec.state() != v1::RUNNING) return false;
  if (plan && plan->world_size == job->rec.placement_size()) plan.reset();
  if (!plan && !job->resize) return false;  // the common case, every pass: nothing to change
  const bool fresh = plan && !job->resize;
  job->resize = std::move(plan);
  job->waiting.clear();
  if (const auto& p = job->resize) {
    const std::string size = std::to_string(p->world_size);
    if (p->for_job.job_id.empty()) {
      job->waiting = "growing to " + size + " ranks";
    } else if (p->world_size > 0) {
      job->waiting = "shrinking to " + size + " ranks" + ForJob(p->for_job);
    } else {
      job->waiting = "yielding its slots" + ForJob(p->for_job);
    }
    job->waiting += " at its next checkpoint";
  }
  UpdateReason(*job);
  if (!job->resize) {
    if (job->checkpoint_asked && job->checkpoint_asked->for_resize) job->checkpoint_asked.reset();
    return false;
  }
  if (!fresh || job->checkpoint_asked) return false;
  AskCheckpoint(*job, job->waiting, /*for_resize=*/true);
  return true;
}

int64_t JobManager::AskCheckpoint(Job& job, const std::string& reason, bool for_resize) {
  if (job.checkpoint_asked) {
    // A user's request outlives the withdrawal of a plan's.
    if (!for_resize) job.checkpoint_asked->for_resize = false;
    return job.checkpoint_asked->after_step;
  }
  // Ranks report their steps with a heartbeat's delay: what they save is at least one step
  // past the newest report, and never the checkpoint that may be in flight now.
  int64_t after = job.rec.latest_checkpoint_step();
  for (const Rank& r : job.ranks) after = std::max(after, r.status.progress().step());
  job.last_request_id = std::max(clock_->WallNowMs(), job.last_request_id + 1);
  job.checkpoint_asked = Job::CheckpointAsked{job.last_request_id, after, reason, for_resize};
  spdlog::info("job {}: asking for a checkpoint after step {} ({})", job.rec.job_id(), after,
               reason);
  return after;
}

StatusOr<int64_t> JobManager::RequestCheckpoint(const std::string& job_id,
                                                const std::string& reason) {
  Job* job = Get(job_id);
  if (!job) return NotFoundError("no job " + job_id);
  if (job->rec.state() != v1::RUNNING) {
    return FailedPreconditionError("job " + job_id + " is " + v1::JobState_Name(job->rec.state()) +
                                   ": only a running job can save a checkpoint");
  }
  if (!job->spec.checkpoint.enabled()) {
    return FailedPreconditionError(
        "job " + job_id +
        " saves no checkpoints (its checkpoint.every_steps and every_minutes are 0)");
  }
  return AskCheckpoint(*job, reason, /*for_resize=*/false);
}

void JobManager::Resize(Job& job, int64_t step) {
  const int from = job.rec.placement_size();
  const ResizePlan plan = *job.resize;
  const int to = plan.world_size;
  const std::string at = " at the checkpoint of step " + std::to_string(step);
  std::string what;
  if (to == 0) {
    what = "preempted by job " + plan.for_job.job_id + " (priority " +
           std::to_string(plan.for_job.priority) + ")" + at;
  } else {
    what = "resized: " + std::string(to > from ? "growing" : "shrinking") + " from " +
           std::to_string(from) + " to " + std::to_string(to) + " ranks" + at +
           ForJob(plan.for_job);
  }
  v1::AttemptRecord& a = EndAttempt(job, what, clock_->WallNowMs());
  job.rec.set_state(v1::RECOVERING);
  job.rec.set_restart_not_before_ms(0);
  job.failure = what;
  // Until its old ranks' slots are back, its next attempt takes only the planned size; a
  // preempted job takes what it finds when slots are free again.
  job.hold_size = to;
  job.hold_until_ms = to > 0 ? clock_->WallNowMs() + options_.stop_grace_ms + 1000 : 0;
  if (to > 0) next_restart_ms_ = std::min(next_restart_ms_, job.hold_until_ms);
  UpdateReason(job);
  spdlog::info("job {}: {}", job.rec.job_id(), what);
  Persist(job, &a);
}

std::vector<std::string> JobManager::CheckStragglers(
    int64_t now_ms, const std::function<bool(v1::DeviceKind)>& spare) {
  std::vector<std::string> asked;
  for (const auto& [seq, id] : live_) {
    Job& job = *Get(id);
    if (job.rec.state() != v1::RUNNING ||
        job.spec.fault_tolerance.replace_stragglers_after_s <= 0) {
      continue;
    }
    std::vector<RankPace> paces;
    double pace_ms = 0;
    int paced = 0;  // ranks that report a pace
    for (const Rank& r : job.ranks) {
      if (r.status.state() != v1::TRAINER_RUNNING) continue;
      const v1::TrainerProgress& p = r.status.progress();
      paces.push_back({r.status.rank(), p.pp_stage(), p.busy_ms()});
      pace_ms = std::max(pace_ms, p.pace_ms());
      paced += p.pace_ms() > 0 ? 1 : 0;
    }
    // A rank that falls back in step starts its count again.
    const std::vector<Straggler> found =
        FindStragglers(paces, job.spec.fault_tolerance.straggler_factor);
    if (found.empty() && paced == job.rec.placement_size()) {
      // In the record, written with it (JobRecord.healthy_pace_ms): a job grown back onto a
      // slot still slow, or whose coordinator restarted, has a pace to drop it by.
      (*job.rec.mutable_healthy_pace_ms())[job.rec.placement_size()] = pace_ms;
    }
    std::map<int, int64_t> since;
    for (const Straggler& s : found) {
      auto it = job.straggling_since.find(s.rank);
      since[s.rank] = it == job.straggling_since.end() ? now_ms : it->second;
    }
    job.straggling_since = std::move(since);
    // Planned: it happens at the checkpoint asked for. A job out of time ends there.
    if (job.replace || job.time_up) continue;
    if (PlanReplacement(job, found, pace_ms, now_ms, spare)) asked.push_back(id);
  }
  return asked;
}

bool JobManager::PlanReplacement(Job& job, const std::vector<Straggler>& found, double pace_ms,
                                 int64_t now_ms, const std::function<bool(v1::DeviceKind)>& spare) {
  const double after_ms = job.spec.fault_tolerance.replace_stragglers_after_s * 1000.0;
  auto for_ms = [&](const Straggler& s) { return now_ms - job.straggling_since.at(s.rank); };
  auto long_enough = [&](const Straggler& s) { return static_cast<double>(for_ms(s)) >= after_ms; };
  // The straggler's slot, and "rank 1 on n2 slot 0 (busy 150 ms a step ...)".
  auto describe = [&](const Straggler& s) -> std::optional<Job::Replacement::Straggler> {
    for (const v1::RankAssignment& a : job.rec.placement()) {
      if (a.rank() != s.rank) continue;
      return Job::Replacement::Straggler{
          a.node(), a.slot(),
          "rank " + std::to_string(s.rank) + " on " + a.node() + " slot " +
              std::to_string(a.slot()) + " (busy " + std::to_string(std::llround(s.busy_ms)) +
              " ms a step against " + std::to_string(std::llround(s.peers_busy_ms)) +
              " ms for the others of its stage, for " + std::to_string(for_ms(s) / 1000) + " s)"};
    }
    return std::nullopt;
  };
  const Straggler* longest = nullptr;
  for (const Straggler& s : found) {
    if (!longest || for_ms(s) > for_ms(*longest)) longest = &s;
  }
  if (!longest || !long_enough(*longest)) return false;
  const int size = job.rec.placement_size();
  Job::Replacement plan;
  if (spare(job.rec.device())) {
    // Moved to the free slot, the longest straggling first: one at a time.
    auto moved = describe(*longest);
    if (!moved) return false;
    plan.stragglers.push_back(*moved);
    plan.world_size = size;
    plan.what = "replacing straggler " + moved->who;
  } else {
    // Dropped, when the others would step sooner without them: all at once, since the job
    // keeps the pace of the slowest one left.
    if (!std::all_of(found.begin(), found.end(), long_enough)) return false;
    const std::map<int, double> healthy(job.rec.healthy_pace_ms().begin(),
                                        job.rec.healthy_pace_ms().end());
    const std::optional<Shrink> shrink =
        ShrinkWithout(static_cast<int>(found.size()), size, job.feasible, healthy, pace_ms);
    if (!shrink) return false;
    std::string who;
    for (const Straggler& s : found) {
      auto dropped = describe(s);
      if (!dropped) return false;
      who += (who.empty() ? "" : " and ") + dropped->who;
      plan.stragglers.push_back(*dropped);
    }
    const bool one = found.size() == 1;
    plan.world_size = shrink->world_size;
    plan.what = (one ? "dropping straggler " : "dropping stragglers ") + who;
    const auto ms = [](double v) { return std::to_string(std::llround(v)) + " ms"; };
    plan.how = ", shrinking from " + std::to_string(size) + " to " +
               std::to_string(shrink->world_size) + " ranks: no free slot to move " +
               (one ? "it" : "them") + " to, and a step without " + (one ? "it" : "them") +
               " should take about " + ms(shrink->step_ms_after) + " (" + Basis(*shrink) +
               ") against " + ms(pace_ms) + " now";
  }
  job.replace = std::move(plan);
  job.waiting = job.replace->what + " at its next checkpoint" + job.replace->how;
  UpdateReason(job);
  AskCheckpoint(job, job.waiting, /*for_resize=*/false);
  return true;
}

std::string JobManager::PlanSlotDrain(const std::string& node, int slot, const std::string& why,
                                      const std::function<bool(v1::DeviceKind)>& spare,
                                      bool* checkpoints) {
  // Found first, acted on after: ending an attempt changes ranks_on_node_.
  std::string id;
  int rank = -1;
  if (auto it = ranks_on_node_.find(node); it != ranks_on_node_.end()) {
    for (const auto& [job_id, ranks] : it->second) {
      const Job& job = *Get(job_id);
      if (job.rec.state() != v1::RUNNING) continue;
      for (int r : ranks) {
        if (job.rec.placement(r).slot() == slot && !job.ranks[r].done) {
          id = job_id;
          rank = r;
        }
      }
    }
  }
  if (id.empty()) return "";
  Job& job = *Get(id);
  *checkpoints = job.spec.checkpoint.enabled();
  if (job.replace) return id;  // its attempt ends at its checkpoint anyway
  const int size = job.rec.placement_size();
  const std::string who = "rank " + std::to_string(rank) + " off " + node + " slot " +
                          std::to_string(slot) + " (" + why + ")";
  Job::Replacement plan;  // no stragglers: the slot is the operator's to cordon
  plan.what = "moving " + who;
  if (spare(job.rec.device())) {
    plan.world_size = size;
  } else {
    for (int s : job.feasible) {
      if (s < size) plan.world_size = s;
    }
    plan.how = plan.world_size > 0
                   ? ", shrinking from " + std::to_string(size) + " to " +
                         std::to_string(plan.world_size) + " ranks: no free slot to move it to"
                   : ", to wait for a free slot: none is free, and no smaller "
                     "world size is feasible";
  }
  job.replace = std::move(plan);
  if (!*checkpoints) {
    Replace(job, "now (it saves no checkpoints: it starts again from step 0)");
    return id;
  }
  job.waiting = job.replace->what + " at its next checkpoint" + job.replace->how;
  UpdateReason(job);
  AskCheckpoint(job, job.waiting, /*for_resize=*/false);
  return id;
}

void JobManager::Replace(Job& job, const std::string& when) {
  const Job::Replacement r = *job.replace;
  for (const Job::Replacement::Straggler& s : r.stragglers) {
    if (hooks_.slot_straggling) {
      hooks_.slot_straggling(s.node, s.slot, "job " + job.rec.job_id() + ": straggler " + s.who);
    }
    // What slows a rank is often its node's (CPUs something else uses, a slow disk), not its
    // slot's alone: the next placement prefers other nodes where the gang fits.
    job.avoid.insert(s.node);
  }
  const std::string what = r.what + " " + when + r.how;
  const int64_t now = clock_->WallNowMs();
  v1::AttemptRecord& a = EndAttempt(job, what, now);
  job.rec.set_state(v1::RECOVERING);
  job.rec.set_restart_not_before_ms(0);
  job.failure = what;
  // As after a resize: at its new size (the same, for a move), on the old ranks' slots but
  // the cordoned ones (and a free one), once they are given back; after that, whatever fits.
  job.hold_size = r.world_size;
  job.hold_until_ms = now + options_.stop_grace_ms + 1000;
  next_restart_ms_ = std::min(next_restart_ms_, job.hold_until_ms);
  UpdateReason(job);
  spdlog::info("job {}: {}", job.rec.job_id(), what);
  Persist(job, &a);
}

}  // namespace drover::coordinator
