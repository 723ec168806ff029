// JobManager's operator changes to a job: drover suspend and resume (job_manager.h,
// "Suspension"), and drover priority.
#include <spdlog/spdlog.h>

#include <string>

#include "common/duration.h"
#include "common/job_state.h"
#include "common/yaml_util.h"
#include "coordinator/job_manager.h"

namespace drover::coordinator {
namespace {

void MarkAsked(v1::JobRecord* r, const v1::SuspendJobRequest& request, int64_t at_ms) {
  r->set_suspend(true);
  r->set_suspended_by(request.requester());
  r->set_suspend_reason(request.reason());
  r->set_suspend_asked_ms(at_ms);
}

void ClearAsked(v1::JobRecord* r) {
  r->clear_suspend();
  r->clear_suspended_by();
  r->clear_suspend_reason();
  r->clear_suspend_asked_ms();
}

// How a RUNNING job suspended at once (SuspendJobRequest.now) will resume: what its attempt
// ends with.
std::string AtOnce(const JobSpec& spec, const v1::JobRecord& rec) {
  if (!spec.checkpoint.enabled()) {
    return " at once (it saves no checkpoints: it starts again from step 0)";
  }
  if (rec.latest_checkpoint_step() < 0)
    return " at once (no checkpoint yet: it starts again from step 0)";
  return " at once (it resumes from its newest complete checkpoint, of step " +
         std::to_string(rec.latest_checkpoint_step()) + ")";
}

}  // namespace

std::string JobManager::SuspendedBy(const v1::JobRecord& rec) {
  std::string s = rec.suspended_by().empty() ? "" : " by " + rec.suspended_by();
  if (!rec.suspend_reason().empty()) s += ": " + rec.suspend_reason();
  return s;
}

std::string JobManager::SuspendText(const v1::JobRecord& rec) {
  if (rec.state() == v1::SUSPENDED) {
    return "suspended" + SuspendedBy(rec) + "; drover resume " + rec.job_id() + " places it again";
  }
  return "suspending at its next checkpoint (drover suspend" + SuspendedBy(rec) + ")";
}

void JobManager::MakeSuspended(Job& job) {
  job.rec.clear_placement();
  job.rec.set_state(v1::SUSPENDED);
  job.failure.clear();
  job.waiting.clear();
  job.resize.reset();
  job.replace.reset();
  job.hold_size = 0;
  job.regroup_until_ms = 0;
  UpdateReason(job);
}

JobManager::JobPlan JobManager::NewPlan(const Job& job) const {
  JobPlan plan;
  plan.job_id = job.rec.job_id();
  plan.version = job.version;
  plan.at_ms = clock_->WallNowMs();
  plan.state = job.rec.state();
  return plan;
}

StatusOr<JobManager::JobPlan> JobManager::PlanSuspend(const v1::SuspendJobRequest& request) const {
  const Job* job = Get(request.job_id());
  if (!job) return NotFoundError("no job " + request.job_id());
  const v1::JobRecord& rec = job->rec;
  if (IsTerminal(rec.state())) {
    return FailedPreconditionError("job " + rec.job_id() + " is " + v1::JobState_Name(rec.state()) +
                                   ": only a job that has not finished can be suspended");
  }
  JobPlan plan = NewPlan(*job);
  plan.request = request;
  const bool running = rec.state() == v1::RUNNING;
  // Asked already; only `now` hurries a job still waiting for its checkpoint.
  if (rec.state() == v1::SUSPENDED || (rec.suspend() && !(running && request.now()))) {
    return plan;
  }
  if (running && !job->spec.checkpoint.enabled() && !request.now()) {
    return FailedPreconditionError(
        "job " + rec.job_id() +
        " saves no checkpoints (its checkpoint.every_steps and every_minutes are 0): "
        "suspended, it would start again from step 0 when resumed; --now suspends it "
        "anyway");
  }
  v1::JobRecord next = rec;
  MarkAsked(&next, request, plan.at_ms);
  if (running && !request.now()) {
    plan.change = JobPlan::kAsk;
  } else {
    plan.change = JobPlan::kSuspendNow;
    if (running) {
      auto it = job->attempts.find(rec.attempt());
      v1::AttemptRecord a = it == job->attempts.end() ? v1::AttemptRecord() : it->second;
      a.set_job_id(rec.job_id());
      a.set_attempt(rec.attempt());
      a.set_ended_ms(plan.at_ms);
      a.set_end_reason("suspended" + SuspendedBy(next) + AtOnce(job->spec, rec));
      plan.batch.attempts.push_back(std::move(a));
    }
    next.clear_placement();
    next.set_state(v1::SUSPENDED);
    next.set_reason(SuspendText(next));
  }
  plan.state = next.state();
  plan.batch.jobs.push_back(std::move(next));
  return plan;
}

StatusOr<JobManager::JobPlan> JobManager::PlanResume(const std::string& job_id) const {
  const Job* job = Get(job_id);
  if (!job) return NotFoundError("no job " + job_id);
  const v1::JobRecord& rec = job->rec;
  JobPlan plan = NewPlan(*job);
  if (IsTerminal(rec.state()) || !rec.suspend()) return plan;  // not suspended
  plan.change = JobPlan::kResume;
  v1::JobRecord next = rec;
  ClearAsked(&next);
  if (rec.state() == v1::SUSPENDED) next.set_state(v1::PENDING);
  next.set_reason("");
  plan.state = next.state();
  plan.batch.jobs.push_back(std::move(next));
  return plan;
}

StatusOr<JobManager::JobPlan> JobManager::PlanPriority(const std::string& job_id,
                                                       int priority) const {
  const Job* job = Get(job_id);
  if (!job) return NotFoundError("no job " + job_id);
  const v1::JobRecord& rec = job->rec;
  if (IsTerminal(rec.state())) {
    return FailedPreconditionError("job " + job_id + " is " + v1::JobState_Name(rec.state()) +
                                   ": a finished job has no place in the queue to change");
  }
  JobPlan plan = NewPlan(*job);
  plan.priority = priority;
  plan.previous_priority = rec.priority();
  if (rec.priority() == priority) return plan;
  plan.change = JobPlan::kPriority;
  v1::JobRecord next = rec;
  next.set_priority(priority);
  plan.batch.jobs.push_back(std::move(next));
  return plan;
}

StatusOr<JobManager::JobPlan> JobManager::PlanTimeLimit(const std::string& job_id,
                                                        double minutes) const {
  const Job* job = Get(job_id);
  if (!job) return NotFoundError("no job " + job_id);
  const v1::JobRecord& rec = job->rec;
  if (IsTerminal(rec.state())) {
    return FailedPreconditionError("job " + job_id + " is " + v1::JobState_Name(rec.state()) +
                                   ": a finished job's time limit cannot change (submitted "
                                   "again, with the same checkpoint.dir, a job goes on from "
                                   "its newest checkpoint)");
  }
  JobPlan plan = NewPlan(*job);
  plan.previous_minutes = job->spec.resources.time_limit_minutes;
  plan.ran_ms = RanMs(*job, plan.at_ms);
  const std::string limit = yaml_util::FormatDouble(minutes);
  StatusOr<std::string> yaml =
      ApplyOverrides(rec.spec_yaml(), {"resources.time_limit_minutes=" + limit}, "job " + job_id);
  if (!yaml.ok()) return InvalidArgumentError(yaml.status().message());
  StatusOr<JobSpec> spec = ParseJobSpec(*yaml, {}, "job " + job_id);
  if (!spec.ok()) return InvalidArgumentError(spec.status().message());
  if (yaml->size() > kMaxSpecBytes) {
    return InvalidArgumentError("job " + job_id + "'s spec with the new time limit is " +
                                std::to_string(yaml->size()) + " bytes; at most " +
                                std::to_string(kMaxSpecBytes) + " are kept");
  }
  if (spec->resources.time_limit_minutes == plan.previous_minutes) return plan;
  plan.change = JobPlan::kTimeLimit;
  plan.spec = std::move(*spec);
  plan.spec_yaml = std::move(*yaml);
  v1::JobRecord next = rec;
  next.set_spec_yaml(plan.spec_yaml);
  plan.batch.jobs.push_back(std::move(next));
  return plan;
}

bool JobManager::ApplyJobPlan(JobPlan* planned) {
  JobPlan& plan = *planned;
  plan.after_step = -1;
  Job* job = Get(plan.job_id);
  if (!job || job->version != plan.version) return false;
  v1::JobRecord& r = job->rec;
  switch (plan.change) {
    case JobPlan::kNone:
      if (r.state() == v1::RUNNING && job->checkpoint_asked) {
        plan.after_step = job->checkpoint_asked->after_step;
      }
      return true;
    case JobPlan::kAsk:
      MarkAsked(&r, plan.request, plan.at_ms);
      job->resize.reset();
      job->replace.reset();
      plan.after_step = AskCheckpoint(*job, "drover suspend", /*for_resize=*/false);
      UpdateReason(*job);
      break;
    case JobPlan::kSuspendNow:
      MarkAsked(&r, plan.request, plan.at_ms);
      if (r.state() == v1::RUNNING) {
        EndAttempt(*job, "suspended" + SuspendedBy(r) + AtOnce(job->spec, r), plan.at_ms);
      }
      MakeSuspended(*job);
      break;
    case JobPlan::kPriority:
      spdlog::info("job {}: priority {} -> {}", r.job_id(), r.priority(), plan.priority);
      r.set_priority(plan.priority);
      ++job->version;
      return true;
    case JobPlan::kTimeLimit:
      r.set_spec_yaml(plan.spec_yaml);
      job->spec = plan.spec;
      spdlog::info("job {}: time limit {} -> {} ({} used)", r.job_id(),
                   FormatTimeLimit(plan.previous_minutes),
                   FormatTimeLimit(job->spec.resources.time_limit_minutes),
                   FormatDurationMs(plan.ran_ms));
      // Stopping at the old limit: trains on if the new one leaves it time.
      if (job->time_up && !TimeUsedUp(*job, plan.at_ms)) {
        job->time_up = false;
        UpdateReason(*job);
      }
      ++job->version;
      return true;
    case JobPlan::kResume:
      ClearAsked(&r);
      if (r.state() == v1::SUSPENDED) r.set_state(v1::PENDING);
      UpdateReason(*job);
      break;
  }
  Reindex(*job);
  ++job->version;  // what the plan wrote is the job's newest durable record
  spdlog::info("job {}: {}", r.job_id(), plan.change == JobPlan::kResume ? "resumed" : r.reason());
  return true;
}

}  // namespace drover::coordinator
