// JobManager's records of jobs (restore, submit, removal, the queue and what the scheduler
// and the RPCs read of them). The attempts' life, from placement to their end, and cancels
// are in job_manager_attempts.cc; resizes and stragglers in job_manager_resize.cc.
#include "coordinator/job_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/duration.h"
#include "common/job_state.h"

namespace drover::coordinator {
namespace {

v1::DeviceKind DeviceOf(const JobSpec& spec) {
  return spec.resources.device == "cuda" ? v1::CUDA : v1::CPU;
}

}  // namespace

JobManager::JobManager(const Clock* clock, JobManagerOptions options, Hooks hooks)
    : clock_(clock), options_(std::move(options)), hooks_(std::move(hooks)) {}

JobManager::Job* JobManager::Get(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobManager::Job* JobManager::Get(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

void JobManager::Reindex(const Job& job) {
  const v1::JobRecord& r = job.rec;
  if (!IsTerminal(r.state())) {
    live_[r.submit_seq()] = r.job_id();
  } else if (live_.erase(r.submit_seq()) > 0) {
    ++finished_counts_[r.state()];
  }
}

void JobManager::Persist(Job& job, const v1::AttemptRecord* attempt) {
  Reindex(job);
  ++job.version;
  if (!hooks_.persist) return;
  StoreBatch batch;
  batch.jobs.push_back(job.rec);
  if (attempt) batch.attempts.push_back(*attempt);
  hooks_.persist(std::move(batch));
}

void JobManager::IndexPlacement(const Job& job, bool add) {
  const std::string& id = job.rec.job_id();
  for (int r = 0; r < job.rec.placement_size(); ++r) {
    const std::string& node = job.rec.placement(r).node();
    if (add) {
      ranks_on_node_[node][id].push_back(r);
    } else if (auto it = ranks_on_node_.find(node); it != ranks_on_node_.end()) {
      it->second.erase(id);
      if (it->second.empty()) ranks_on_node_.erase(it);
    }
  }
}

void JobManager::UpdateReason(Job& job) {
  const v1::JobState state = job.rec.state();
  if (job.time_up && state == v1::RUNNING) {
    job.rec.set_reason("time limit of " + FormatDurationMs(TimeLimitMs(job)) +
                       " reached (resources.time_limit_minutes): stopping at the checkpoint asked "
                       "for now");
    return;
  }
  if (job.rec.suspend() && (state == v1::RUNNING || state == v1::SUSPENDED)) {
    job.rec.set_reason(SuspendText(job.rec));
    return;
  }
  std::string r = job.rec.state() == v1::RECOVERING ? job.failure : "";
  if (!job.waiting.empty()) r += (r.empty() ? "" : "; ") + job.waiting;
  job.rec.set_reason(r);
}

void JobManager::Restore(const std::vector<v1::JobRecord>& jobs,
                         const std::vector<v1::AttemptRecord>& attempts) {
  for (const auto& rec : jobs) {
    Job job;
    job.rec = rec;
    auto spec = ParseJobSpec(rec.spec_yaml(), {}, "job " + rec.job_id());
    if (spec.ok()) {
      job.spec = *spec;
      job.feasible = job.spec.FeasibleWorldSizes();
    } else if (!IsTerminal(rec.state())) {
      // The spec parsed when it was submitted; a newer coordinator may reject it.
      spdlog::error("job {}: stored spec no longer parses: {}", rec.job_id(),
                    spec.status().ToString());
      job.rec.set_state(v1::FAILED);
      job.rec.set_reason("stored spec no longer parses: " + spec.status().message());
      job.rec.set_finished_ms(clock_->WallNowMs());
      Persist(job, nullptr);
    }
    if (job.rec.state() == v1::RECOVERING) {
      job.failure = job.rec.reason();
      if (job.rec.restart_not_before_ms() > 0) {
        next_restart_ms_ = std::min(next_restart_ms_, job.rec.restart_not_before_ms());
      }
    }
    if (job.rec.state() == v1::RUNNING) {
      job.ranks.resize(job.rec.placement_size());
      IndexPlacement(job, true);
      // Asked to suspend before the restart: asked for its checkpoint again (the request
      // lived in memory).
      if (job.rec.suspend()) AskCheckpoint(job, "drover suspend", /*for_resize=*/false);
    }
    by_seq_[rec.submit_seq()] = rec.job_id();
    if (IsTerminal(job.rec.state())) {
      ++finished_counts_[job.rec.state()];
    } else {
      live_[rec.submit_seq()] = rec.job_id();
    }
    if (!rec.request_id().empty()) by_request_id_[rec.request_id()] = rec.job_id();
    jobs_[rec.job_id()] = std::move(job);
  }
  for (const auto& a : attempts) {
    if (Job* job = Get(a.job_id())) job->attempts[a.attempt()] = a;
  }
}

StatusOr<JobManager::NewJob> JobManager::PrepareSubmit(const std::string& spec_yaml, int priority,
                                                       const std::string& job_id,
                                                       int64_t submit_seq) const {
  // Kept in the state and sent with every start order: bounded, so that no record or order
  // grows with what one caller sends (a spec is a few kilobytes).
  if (spec_yaml.size() > kMaxSpecBytes) {
    return InvalidArgumentError("the job spec is " + std::to_string(spec_yaml.size()) +
                                " bytes; at most " + std::to_string(kMaxSpecBytes) +
                                " are accepted (comments included)");
  }
  auto spec = ParseJobSpec(spec_yaml, {}, "job spec");
  if (!spec.ok()) return InvalidArgumentError(spec.status().message());
  NewJob job{{}, *spec};
  v1::JobRecord& r = job.record;
  r.set_job_id(job_id);
  r.set_name(job.spec.name);
  r.set_spec_yaml(spec_yaml);
  r.set_state(v1::PENDING);
  r.set_max_restarts(job.spec.fault_tolerance.max_restarts);
  r.set_priority(priority);
  r.set_min_world_size(job.spec.resources.world_size.min);
  r.set_max_world_size(job.spec.resources.world_size.max);
  r.set_device(DeviceOf(job.spec));
  r.set_submitted_ms(clock_->WallNowMs());
  r.set_submit_seq(submit_seq);
  r.set_latest_checkpoint_step(-1);
  r.set_output_dir(job.spec.output_dir);
  return job;
}

void JobManager::Add(NewJob added) {
  const std::string id = added.record.job_id();
  DROVER_CHECK_MSG(!jobs_.count(id), "JobManager::Add: the job id is taken");
  Job& job = jobs_[id];
  by_seq_[added.record.submit_seq()] = id;
  if (!added.record.request_id().empty()) by_request_id_[added.record.request_id()] = id;
  job.rec = std::move(added.record);
  job.spec = std::move(added.spec);
  job.feasible = job.spec.FeasibleWorldSizes();
  Reindex(job);
}

bool JobManager::Remove(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return false;
  const v1::JobRecord& rec = it->second.rec;
  DROVER_CHECK_MSG(IsTerminal(rec.state()), "JobManager::Remove: the job has not finished");
  by_seq_.erase(rec.submit_seq());
  --finished_counts_[rec.state()];
  if (!rec.request_id().empty()) by_request_id_.erase(rec.request_id());
  jobs_.erase(it);
  return true;
}

std::vector<std::string> JobManager::FinishedBefore(int64_t cutoff_ms, size_t max) const {
  std::vector<std::string> out;
  for (const auto& [seq, id] : by_seq_) {
    if (out.size() >= max) break;
    const v1::JobRecord& rec = Get(id)->rec;
    if (IsTerminal(rec.state()) && rec.finished_ms() <= cutoff_ms) out.push_back(id);
  }
  return out;
}

std::vector<PendingJob> JobManager::Pending() {
  std::vector<PendingJob> out;
  const int64_t now = clock_->WallNowMs();
  next_restart_ms_ = INT64_MAX;
  for (const auto& [seq, id] : live_) {
    Job& job = *Get(id);
    if (job.rec.state() != v1::PENDING && job.rec.state() != v1::RECOVERING) continue;
    // A job in its restart delay holds no place in the queue: the jobs behind it may use
    // the slots meanwhile, as they could if it had failed for good.
    if (job.rec.restart_not_before_ms() > now) {
      next_restart_ms_ = std::min(next_restart_ms_, job.rec.restart_not_before_ms());
      ShowRestartDelay(job, now);
      continue;
    }
    // Out of the queue until the jobs it runs after have succeeded: it holds no place there.
    if (std::string awaited = AwaitedJobs(job); !awaited.empty()) {
      job.waiting = std::move(awaited);
      UpdateReason(job);
      continue;
    }
    PendingJob p{id,           job.rec.priority(), job.rec.submit_seq(), job.rec.device(),
                 job.feasible, job.avoid};
    if (job.hold_size > 0 && now < job.hold_until_ms) {
      // Captured by value: clang 14 (the fuzz build) cannot capture a structured binding.
      std::erase_if(p.feasible_world_sizes, [hold = job.hold_size](int s) { return s < hold; });
      next_restart_ms_ = std::min(next_restart_ms_, job.hold_until_ms);
    }
    p.rank_block = job.spec.RankBlock();
    if (const int64_t limit = TimeLimitMs(job); limit > 0) {
      p.time_left_ms = std::max<int64_t>(1, limit - RanMs(job, now));
    }
    if (now < job.regroup_until_ms) {
      p.regrouping = true;
      next_restart_ms_ = std::min(next_restart_ms_, job.regroup_until_ms);
    }
    out.push_back(std::move(p));
  }
  return out;
}

Status JobManager::CheckAfter(const google::protobuf::RepeatedPtrField<std::string>& after) const {
  if (after.size() > kMaxAfterJobs) {
    return InvalidArgumentError("a job may run after at most " + std::to_string(kMaxAfterJobs) +
                                " jobs, not " + std::to_string(after.size()));
  }
  for (const std::string& id : after) {
    RETURN_IF_ERROR(CheckLength("the id of a job to run after", id, kMaxJobIdBytes));
    if (Get(id) == nullptr) return NotFoundError("no job " + id + " to run after");
  }
  return OkStatus();
}

std::string JobManager::AwaitedJobs(const Job& job) const {
  if (job.rec.after().empty() || job.rec.attempt() > 0) return "";
  std::string waiting;
  for (const std::string& id : job.rec.after()) {
    const Job* before = Get(id);
    if (before == nullptr) {
      return "it runs after job " + id +
             ", which is no longer known (deleted), so it can never start: drover cancel " +
             job.rec.job_id();
    }
    const v1::JobState state = before->rec.state();
    if (state == v1::SUCCEEDED) continue;
    if (IsTerminal(state)) {
      return "it runs after job " + id + " succeeds, and that job ended " +
             v1::JobState_Name(state) + ", so it can never start: drover cancel " +
             job.rec.job_id();
    }
    waiting += (waiting.empty() ? "" : ", ") + id + " (" + v1::JobState_Name(state) + ")";
  }
  return waiting.empty() ? "" : "waiting for " + waiting + " to succeed";
}

void JobManager::ShowRestartDelay(Job& job, int64_t now_ms) {
  const int64_t left_ms = job.rec.restart_not_before_ms() - now_ms;
  if (left_ms > 0) {
    job.waiting = "restarting in " + std::to_string((left_ms + 999) / 1000) + " s after " +
                  std::to_string(job.rec.failures_in_a_row()) + " failures in a row";
  }
  UpdateReason(job);
}

void JobManager::SetWaitingReason(const std::string& job_id, const std::string& reason) {
  if (Job* job = Get(job_id)) {
    job->waiting = reason;
    UpdateReason(*job);
  }
}

const JobSpec* JobManager::SpecOf(const std::string& job_id) const {
  const Job* job = Get(job_id);
  return job ? &job->spec : nullptr;
}

const v1::JobRecord* JobManager::Find(const std::string& job_id) const {
  const Job* job = Get(job_id);
  return job ? &job->rec : nullptr;
}

bool JobManager::IsCurrent(const TrainerKey& key) const {
  const Job* job = Get(key.job_id);
  return job && key.rank >= 0 && key.rank < job->rec.placement_size() &&
         CurrentRank(job->rec.placement(key.rank).node(), key) != nullptr;
}

int64_t JobManager::HangTimeoutMs(const std::string& job_id) const {
  const Job* job = Get(job_id);
  return job ? static_cast<int64_t>(job->spec.fault_tolerance.hang_timeout_s * 1000.0) : 0;
}

std::optional<int> JobManager::SlotOf(const std::string& node, const TrainerKey& key) const {
  const Job* job = Get(key.job_id);
  if (!job) return std::nullopt;
  auto a = job->attempts.find(key.attempt);
  if (a == job->attempts.end() || key.rank < 0 || key.rank >= a->second.placement_size()) {
    return std::nullopt;
  }
  const v1::RankAssignment& p = a->second.placement(key.rank);
  if (p.node() != node) return std::nullopt;
  return p.slot();
}

std::vector<int> JobManager::ReservedSlots(const std::string& node) const {
  std::vector<int> slots;
  auto it = ranks_on_node_.find(node);
  if (it == ranks_on_node_.end()) return slots;
  for (const auto& [id, ranks] : it->second) {
    const Job& job = *Get(id);
    for (int r : ranks) slots.push_back(job.rec.placement(r).slot());
  }
  return slots;
}

std::vector<v1::AttemptRecord> JobManager::Attempts(const std::string& job_id) const {
  std::vector<v1::AttemptRecord> out;
  if (const Job* job = Get(job_id)) {
    for (const auto& [n, a] : job->attempts) out.push_back(a);
  }
  return out;
}

std::vector<v1::TrainerStatus> JobManager::CurrentTrainers(const std::string& job_id) const {
  std::vector<v1::TrainerStatus> out;
  if (const Job* job = Get(job_id)) {
    for (const Rank& r : job->ranks) {
      if (r.acked) out.push_back(r.status);
    }
  }
  return out;
}

const v1::JobRecord* JobManager::FindByRequestId(const std::string& request_id) const {
  auto it = by_request_id_.find(request_id);
  return it == by_request_id_.end() ? nullptr : &Get(it->second)->rec;
}

int JobManager::PendingOf(const std::string& submitter) const {
  int n = 0;
  for (const auto& [seq, id] : live_) {
    const v1::JobRecord& rec = Get(id)->rec;
    n += rec.state() == v1::PENDING && rec.submitter() == submitter;
  }
  return n;
}

v1::ListJobsResponse JobManager::ListPage(const v1::ListJobsRequest& request) const {
  constexpr int kDefaultLimit = 100, kMaxLimit = 1000;
  const int limit = request.limit() <= 0 ? kDefaultLimit : std::min(request.limit(), kMaxLimit);
  const std::set<int> states(request.states().begin(), request.states().end());
  // A list of live states only (the dashboard's running jobs) walks the live jobs only.
  const bool live_only = !states.empty() && std::none_of(states.begin(), states.end(), [](int s) {
    return IsTerminal(static_cast<v1::JobState>(s));
  });
  const std::map<int64_t, std::string>& index = live_only ? live_ : by_seq_;
  v1::ListJobsResponse response;
  auto it = request.before_seq() > 0 ? index.lower_bound(request.before_seq()) : index.end();
  while (it != index.begin()) {
    --it;
    const Job& job = *Get(it->second);
    if (!states.empty() && !states.count(job.rec.state())) continue;
    if (!request.name().empty() && job.rec.name() != request.name()) continue;
    if (response.jobs_size() == limit) {
      response.set_next_before_seq(it->first + 1);  // this job starts the next page
      break;
    }
    v1::JobRecord* r = response.add_jobs();
    *r = job.rec;
    r->clear_spec_yaml();
  }
  return response;
}

std::map<v1::JobState, int64_t> JobManager::CountByState() const {
  std::map<v1::JobState, int64_t> counts;
  for (const auto& [state, n] : finished_counts_) {
    if (n > 0) counts[state] = n;
  }
  for (const auto& [seq, id] : live_) ++counts[Get(id)->rec.state()];
  return counts;
}

}  // namespace drover::coordinator
