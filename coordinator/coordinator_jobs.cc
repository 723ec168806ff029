// Coordinator's JobService: submitting, reading, cancelling and deleting jobs, their logs,
// and the retention that deletes finished ones. coordinator.h states the contract.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/job_state.h"
#include "common/mutex.h"
#include "coordinator/coordinator.h"
#include "coordinator/ids.h"
#include "coordinator/limits.h"
#include "coordinator/straggler.h"

namespace drover::coordinator {

Status Coordinator::CheckSubmitter(const v1::SubmitJobRequest& request) const {
  const int max = options_.max_pending_per_submitter;
  if (max <= 0) return OkStatus();
  auto in_flight = submitting_of_.find(request.submitter());
  const int pending = jobs_.PendingOf(request.submitter()) +
                      (in_flight == submitting_of_.end() ? 0 : in_flight->second);
  if (pending < max) return OkStatus();
  const std::string who = request.submitter().empty() ? "(anonymous)" : request.submitter();
  return ResourceExhaustedError("submitter " + who + " has " + std::to_string(pending) +
                                " jobs pending, the most the coordinator accepts "
                                "(--max-pending-per-submitter " +
                                std::to_string(max) + "); wait for some to start, or cancel some");
}

StatusOr<std::string> Coordinator::SubmitJob(const v1::SubmitJobRequest& request) {
  RETURN_IF_ERROR(CheckLength("the submitter", request.submitter(), kMaxSubmitterBytes));
  RETURN_IF_ERROR(CheckLength("the request id", request.request_id(), kMaxRequestIdBytes));
  const std::string& request_id = request.request_id();
  // The job is written first and added to memory only once that is durable: a job the
  // store refuses was never listed, scheduled or run.
  JobManager::NewJob job;
  int64_t seq;
  {
    MutexLock lock(&mu_);
    if (!request_id.empty()) {
      if (const v1::JobRecord* done = jobs_.FindByRequestId(request_id)) return done->job_id();
      if (submitting_request_ids_.count(request_id)) {
        return UnavailableError("a submit with request id " + request_id +
                                " is being recorded; retry to get its job id");
      }
    }
    RETURN_IF_ERROR(CheckSubmitter(request));
    RETURN_IF_ERROR(jobs_.CheckAfter(request.after()));
    const int64_t submit_seq = next_submit_seq_;
    ASSIGN_OR_RETURN(job, jobs_.PrepareSubmit(request.spec_yaml(), request.priority(),
                                              MakeJobId(submit_seq, id_salt_), submit_seq));
    for (const std::string& id : request.after()) {
      if (std::find(job.record.after().begin(), job.record.after().end(), id) ==
          job.record.after().end()) {
        job.record.add_after(id);
      }
    }
    job.record.set_submitter(request.submitter());
    job.record.set_request_id(request_id);
    // Taken even if the store refuses the job: another submit may be queued behind it.
    ++next_submit_seq_;
    StoreBatch batch;
    batch.jobs.push_back(job.record);
    seq = Propose(std::move(batch));
    if (!request_id.empty()) submitting_request_ids_.insert(request_id);
    ++submitting_of_[request.submitter()];
  }
  const std::string job_id = job.record.job_id();
  const Status written = writer_->WaitProposal(seq);
  {
    MutexLock lock(&mu_);
    submitting_request_ids_.erase(request_id);
    if (--submitting_of_[request.submitter()] == 0) submitting_of_.erase(request.submitter());
    if (!written.ok()) return Refused("job not submitted", written);
    jobs_.Add(std::move(job));
    schedule_due_ = true;
  }
  spdlog::info("job {} submitted", job_id);
  return job_id;
}

StatusOr<v1::JobInfo> Coordinator::GetJob(const std::string& job_id) {
  MutexLock lock(&mu_);
  const v1::JobRecord* rec = jobs_.Find(job_id);
  if (!rec) return NotFoundError("no job " + job_id);
  v1::JobInfo info;
  *info.mutable_job() = *rec;
  for (auto& a : jobs_.Attempts(job_id)) *info.add_attempts() = std::move(a);
  for (auto& t : jobs_.CurrentTrainers(job_id)) *info.add_trainers() = std::move(t);
  for (auto& c : checkpoints_.ForJob(job_id)) *info.add_checkpoints() = std::move(c);
  if (rec->state() == v1::RUNNING) AddNotices(*rec, &info);
  return info;
}

void Coordinator::AddNotices(const v1::JobRecord& rec, v1::JobInfo* info) const {
  std::map<int, const v1::RankAssignment*> placed;
  for (const v1::RankAssignment& p : rec.placement()) placed[p.rank()] = &p;
  const auto where = [&](int rank) {
    const auto it = placed.find(rank);
    if (it == placed.end()) return "rank " + std::to_string(rank);
    return "rank " + std::to_string(rank) + " on " + it->second->node() + " slot " +
           std::to_string(it->second->slot());
  };
  for (const v1::RankAssignment& p : rec.placement()) {
    const std::vector<v1::GpuTelemetry>* gpus = nodes_.Gpus(p.node());
    if (gpus == nullptr) continue;
    for (const v1::GpuTelemetry& g : *gpus) {
      const std::string notice = g.slot() == p.slot() ? SlowdownNotice(g) : "";
      if (!notice.empty()) info->add_notices(where(p.rank()) + ": " + notice);
    }
  }
  std::vector<RankPace> paces;
  for (const v1::TrainerStatus& t : info->trainers()) {
    if (t.attempt() != rec.attempt() || t.state() != v1::TRAINER_RUNNING) continue;
    paces.push_back({t.rank(), t.progress().pp_stage(), t.progress().busy_ms()});
  }
  const JobSpec* spec = jobs_.SpecOf(rec.job_id());
  if (spec == nullptr) return;
  for (const Straggler& s : FindStragglers(paces, spec->fault_tolerance.straggler_factor)) {
    info->add_notices(where(s.rank) + " is a straggler: " + StragglerNotice(s));
    info->add_straggler_ranks(s.rank);
  }
}

v1::ListJobsResponse Coordinator::ListJobs(const v1::ListJobsRequest& request) {
  MutexLock lock(&mu_);
  return jobs_.ListPage(request);
}

StatusOr<v1::JobState> Coordinator::CancelJob(const std::string& job_id) {
  // Written first, made in memory once durable (a refused cancel changes nothing), and the
  // state lock is not held across the write. If the job moved on meanwhile (a trainer
  // exited, an attempt started), its newer record was queued after the cancel's and wins
  // on disk: work the cancel out again from the job as it is now.
  constexpr int kTries = 10;
  for (int i = 0; i < kTries; ++i) {
    JobManager::CancelPlan plan;
    int64_t seq;
    {
      MutexLock lock(&mu_);
      const v1::JobRecord* rec = jobs_.Find(job_id);
      if (!rec) return NotFoundError("no job " + job_id);
      if (IsTerminal(rec->state())) return rec->state();
      plan = jobs_.PlanCancel(job_id);
      seq = Propose(plan.batch);
    }
    if (Status st = writer_->WaitProposal(seq); !st.ok()) {
      return Refused("job " + job_id + " not cancelled", st);
    }
    MutexLock lock(&mu_);
    if (jobs_.ApplyCancel(plan)) {
      schedule_due_ = true;
      return v1::CANCELLED;
    }
  }
  return UnavailableError("job " + job_id + " changed state " + std::to_string(kTries) +
                          " times while being cancelled; try again");
}

StatusOr<int64_t> Coordinator::CheckpointJob(const std::string& job_id) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(int64_t after, jobs_.RequestCheckpoint(job_id, "requested by a user"));
  NudgeNodesOf(job_id);
  return after;
}

StatusOr<JobManager::JobPlan> Coordinator::ChangeJob(
    const std::string& what, const std::function<StatusOr<JobManager::JobPlan>()>& plan_change) {
  constexpr int kTries = 10;
  for (int i = 0; i < kTries; ++i) {
    JobManager::JobPlan plan;
    int64_t seq = -1;
    {
      MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(plan, plan_change());
      if (!plan.batch.empty()) seq = Propose(plan.batch);
    }
    if (seq >= 0) {
      if (Status st = writer_->WaitProposal(seq); !st.ok()) return Refused(what, st);
    }
    MutexLock lock(&mu_);
    if (!jobs_.ApplyJobPlan(&plan)) continue;
    if (plan.change == JobManager::JobPlan::kAsk) NudgeNodesOf(plan.job_id);  // checkpoint
    schedule_due_ = true;
    return plan;
  }
  return UnavailableError(what + ": the job changed state " + std::to_string(kTries) +
                          " times meanwhile; try again");
}

StatusOr<v1::SuspendJobResponse> Coordinator::SuspendJob(const v1::SuspendJobRequest& request) {
  RETURN_IF_ERROR(CheckLength("suspend: the reason", request.reason(), kMaxReasonBytes));
  RETURN_IF_ERROR(CheckLength("suspend: the requester", request.requester(), kMaxReasonBytes));
  ASSIGN_OR_RETURN(JobManager::JobPlan plan,
                   ChangeJob("job " + request.job_id() + " not suspended",
                             [&]() REQUIRES(mu_) { return jobs_.PlanSuspend(request); }));
  v1::SuspendJobResponse response;
  response.set_state(plan.state);
  response.set_after_step(plan.after_step);
  return response;
}

StatusOr<v1::JobState> Coordinator::ResumeJob(const std::string& job_id) {
  ASSIGN_OR_RETURN(JobManager::JobPlan plan,
                   ChangeJob("job " + job_id + " not resumed",
                             [&]() REQUIRES(mu_) { return jobs_.PlanResume(job_id); }));
  return plan.state;
}

StatusOr<v1::SetPriorityResponse> Coordinator::SetPriority(const std::string& job_id,
                                                           int priority) {
  ASSIGN_OR_RETURN(JobManager::JobPlan plan,
                   ChangeJob("the priority of job " + job_id + " not changed",
                             [&]() REQUIRES(mu_) { return jobs_.PlanPriority(job_id, priority); }));
  v1::SetPriorityResponse response;
  response.set_previous(plan.previous_priority);
  response.set_state(plan.state);
  return response;
}

StatusOr<v1::SetTimeLimitResponse> Coordinator::SetTimeLimit(const std::string& job_id,
                                                             double minutes) {
  ASSIGN_OR_RETURN(JobManager::JobPlan plan,
                   ChangeJob("the time limit of job " + job_id + " not changed",
                             [&]() REQUIRES(mu_) { return jobs_.PlanTimeLimit(job_id, minutes); }));
  v1::SetTimeLimitResponse response;
  response.set_previous_minutes(plan.previous_minutes);
  response.set_state(plan.state);
  response.set_ran_ms(plan.ran_ms);
  return response;
}

Status Coordinator::DeleteJob(const std::string& job_id) {
  // Like a cancel: written first, forgotten in memory once durable. A finished job never
  // changes again, so nothing can move under the write but another delete or its
  // retention, which forget it the same way.
  int64_t seq;
  {
    MutexLock lock(&mu_);
    const v1::JobRecord* rec = jobs_.Find(job_id);
    if (!rec) return NotFoundError("no job " + job_id);
    if (!IsTerminal(rec->state())) {
      return FailedPreconditionError("job " + job_id + " is " + v1::JobState_Name(rec->state()) +
                                     "; only a finished job can be deleted: cancel it first "
                                     "(drover cancel " +
                                     job_id + ")");
    }
    StoreBatch batch;
    batch.deleted_jobs.push_back(job_id);
    seq = Propose(std::move(batch));
  }
  if (Status st = writer_->WaitProposal(seq); !st.ok()) {
    return Refused("job " + job_id + " not deleted", st);
  }
  {
    MutexLock lock(&mu_);
    jobs_.Remove(job_id);
    checkpoints_.Forget(job_id);
  }
  history_.Forget(job_id);
  spdlog::info("job {} deleted", job_id);
  // Off the state lock: it is disk I/O. A failure leaves files no one lists.
  if (Status st = logs_.Remove(job_id); !st.ok()) spdlog::warn("{}", st.ToString());
  return OkStatus();
}

std::vector<std::string> Coordinator::ExpireJobsLocked() {
  if (options_.job_retention_ms <= 0 || clock_->NowMs() < next_expiry_check_ms_) return {};
  std::vector<std::string> expired =
      jobs_.FinishedBefore(clock_->WallNowMs() - options_.job_retention_ms, kMaxExpiredPerTick);
  // A full batch may have left more behind: look again at the next tick.
  next_expiry_check_ms_ =
      expired.size() < kMaxExpiredPerTick ? clock_->NowMs() + kExpiryCheckMs : 0;
  if (expired.empty()) return expired;
  // Forgotten now and deleted by a commit, not a proposal: nothing waits for it, and if the
  // write fails the coordinator fail-stops; restarted, it expires them again.
  StoreBatch batch;
  for (const std::string& id : expired) {
    jobs_.Remove(id);
    checkpoints_.Forget(id);
    history_.Forget(id);
    batch.deleted_jobs.push_back(id);
  }
  Persist(std::move(batch));
  spdlog::info("deleted {} jobs finished more than {} ago (--job-retention)", expired.size(),
               options_.job_retention_ms);
  return expired;
}

std::map<v1::JobState, int64_t> Coordinator::CountJobsByState() const {
  MutexLock lock(&mu_);
  return jobs_.CountByState();
}

StatusOr<v1::ReadLogsResponse> Coordinator::ReadLogs(const v1::ReadLogsRequest& request) {
  bool finished;
  {
    MutexLock lock(&mu_);
    const v1::JobRecord* rec = jobs_.Find(request.job_id());
    if (!rec) return NotFoundError("no job " + request.job_id());
    // No attempt places more ranks than the spec's largest world size: a rank past it has
    // no log and never will, which an empty answer would hide (a follower would wait on).
    const int ranks = rec->max_world_size();
    if (ranks > 0 && request.rank() >= ranks) {
      return InvalidArgumentError("job " + request.job_id() + " has ranks 0.." +
                                  std::to_string(ranks - 1) + "; there is no rank " +
                                  std::to_string(request.rank()));
    }
    // Agents ship the last lines shortly after a trainer exits: the log is final only a
    // couple of heartbeat periods after the job ended.
    finished = IsTerminal(rec->state()) &&
               clock_->WallNowMs() > rec->finished_ms() + 2 * options_.heartbeat_interval_ms;
  }
  const int rank = request.rank() < 0 ? 0 : request.rank();
  ASSIGN_OR_RETURN(LogStore::Chunk chunk,
                   logs_.Read(request.job_id(), rank, request.offset(), request.max_bytes()));
  v1::ReadLogsResponse response;
  response.set_job_finished(finished && chunk.data.empty());
  response.set_next_offset(chunk.next_offset);
  response.set_data(std::move(chunk.data));
  return response;
}
}  // namespace drover::coordinator
