// JobManager's resizes (growth, shrink, preemption: job_manager.h) and the checkpoint
// requests that make them prompt.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "coordinator/job_manager.h"

namespace drover::coordinator {
namespace {

// " for job J (priority P)": the job a resize makes room for, or "" when it grows.
std::string ForJob(const BlockedJob& j) {
  if (j.job_id.empty()) return "";
  return " for job " + j.job_id + " (priority " + std::to_string(j.priority) + ")";
}

}  // namespace

std::vector<RunningJob> JobManager::Resizable() const {
  std::vector<RunningJob> out;
  for (const auto& [seq, id] : live_) {
    const Job& job = *Get(id);
    if (job.rec.state() != v1::RUNNING || job.feasible.empty()) continue;
    if (job.spec.checkpoint.every_steps <= 0) continue;
    out.push_back({id, job.rec.priority(), job.rec.submit_seq(), job.rec.device(),
                   job.rec.placement_size(), job.feasible});
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
  if (job->spec.checkpoint.every_steps <= 0) {
    return FailedPreconditionError("job " + job_id +
                                   " saves no checkpoints (its checkpoint.every_steps is 0)");
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

}  // namespace drover::coordinator
