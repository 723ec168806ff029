#include "coordinator/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "common/attempt_lease_ms.h"
#include "common/job_state.h"
#include "common/mutex.h"
#include "common/node_slots.h"
#include "coordinator/ids.h"
#include "coordinator/store/sqlite_store.h"
#include "coordinator/straggler.h"

namespace drover::coordinator {
namespace {

constexpr char kSaltCounter[] = "job_id_salt";

int LiveTrainers(const std::vector<v1::TrainerStatus>& listed) {
  return static_cast<int>(std::count_if(listed.begin(), listed.end(), IsLive));
}

std::string StateDb(const CoordinatorOptions& options) { return options.state_dir + "/state.db"; }

// INVALID_ARGUMENT naming the field and its limit when `value` is longer than `max` bytes.
Status CheckLength(const std::string& what, const std::string& value, size_t max) {
  if (value.size() <= max) return OkStatus();
  return InvalidArgumentError(what + " is " + std::to_string(value.size()) + " bytes; at most " +
                              std::to_string(max) + " are accepted");
}

// Names, addresses and slots of a registering node within limits.h's bounds.
Status CheckRegistration(const v1::RegisterRequest& r) {
  RETURN_IF_ERROR(CheckLength("register: the node name", r.name(), kMaxNodeNameBytes));
  RETURN_IF_ERROR(CheckLength("register: the agent id", r.agent_id(), kMaxNodeNameBytes));
  RETURN_IF_ERROR(CheckLength("register: the node uid", r.node_uid(), kMaxNodeNameBytes));
  RETURN_IF_ERROR(CheckLength("register: the address", r.address(), kMaxNodeAddressBytes));
  if (r.slots_size() > kMaxSlotsPerNode) {
    return InvalidArgumentError("register: the node has " + std::to_string(r.slots_size()) +
                                " slots; at most " + std::to_string(kMaxSlotsPerNode) +
                                " are accepted");
  }
  return OkStatus();
}

// The default reaction to a change that is in memory but could not be written: stop at
// once, before anything builds on it (an order sent, a later change written on top). A
// restart then resumes from the last durable state, which is consistent. _Exit, not exit:
// destructors would wait for RPC threads, and the writer would try to drain its queue.
[[noreturn]] void FailStop(const std::string& state_db, const Status& error) {
  spdlog::critical(
      "fail-stop: a state change already made in memory could not be written to {}: {}. "
      "Stopping, so that memory cannot run ahead of disk; restart the coordinator once its "
      "state dir is writable again (free space, permissions): it resumes from the last "
      "durable state",
      state_db, error.ToString());
  spdlog::default_logger()->flush();
  std::_Exit(1);
}

}  // namespace

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options,
                                                         const Clock* clock, CoordinatorDeps deps) {
  if (options.state_dir.empty()) return InvalidArgumentError("--state-dir is required");
  std::error_code ec;
  std::filesystem::create_directories(options.state_dir + "/logs", ec);
  if (ec) {
    return FailedPreconditionError("cannot create state dir " + options.state_dir + ": " +
                                   ec.message());
  }
  std::unique_ptr<Store> store = std::move(deps.store);
  if (!store) {
    ASSIGN_OR_RETURN(store, SqliteStore::Open(StateDb(options)));
  }
  ASSIGN_OR_RETURN(StoreContents contents, store->LoadAll());
  StoreWriter::FatalFn fatal = std::move(deps.fatal);
  if (!fatal) fatal = [db = StateDb(options)](const Status& error) { FailStop(db, error); };
  std::unique_ptr<Coordinator> c(
      new Coordinator(options, clock, std::move(store), std::move(fatal)));
  RETURN_IF_ERROR(c->Restore(contents));
  return c;
}

Coordinator::Coordinator(const CoordinatorOptions& options, const Clock* clock,
                         std::unique_ptr<Store> store, StoreWriter::FatalFn fatal)
    : clock_(clock),
      options_(options),
      store_(std::move(store)),
      writer_(std::make_unique<StoreWriter>(store_.get(), std::move(fatal),
                                            [this](int64_t seq) { OnDurable(seq); })),
      logs_(options.state_dir + "/logs"),
      rendezvous_(clock, AttemptLeaseMs(options.heartbeat_timeout_ms)),
      nodes_(clock, options.nodes),
      health_(options.heartbeat_timeout_ms),
      jobs_(clock, JobManagerOptions{options.stop_grace_ms, "", options.restart_backoff},
            // The job manager calls its hooks from methods this class calls with mu_ held.
            JobManager::Hooks{[this](StoreBatch b) REQUIRES(mu_) { Persist(std::move(b)); },
                              [this](const std::string& job, int64_t attempt) REQUIRES(mu_) {
                                rendezvous_.OpenAttempt(job, attempt);
                                // Its start orders wait until it is durable (OnDurable).
                                undurable_attempts_[job] = last_write_seq_;
                              },
                              [this](const std::string& job, int64_t attempt) REQUIRES(mu_) {
                                undurable_attempts_.erase(job);
                                NudgeNodesOf(job);  // stop orders for the survivors
                                rendezvous_.CloseAttempt(job, attempt);
                                health_.ForgetAttempt(job, attempt);
                                schedule_due_ = true;  // its slots are free, or it waits
                              },
                              [this](const std::string& node, const std::string& why)
                                  REQUIRES(mu_) { CordonCutOff(node, why); },
                              [this](const std::string& node, int slot, const std::string& why)
                                  REQUIRES(mu_) { CordonSlot(node, slot, why); },
                              [this](const std::string& node, int slot, const std::string& why)
                                  REQUIRES(mu_) { CordonSlot(node, slot, why, /*slow=*/true); }}) {}

Coordinator::~Coordinator() {
  // The writer drains its queue in its destructor, before the store closes.
  writer_.reset();
}

void Coordinator::CordonCutOff(const std::string& node, const std::string& why) {
  std::optional<v1::NodeRecord> changed = nodes_.CordonCutOff(node);
  if (!changed) return;
  spdlog::warn("node {} cordoned for {} s: {} (its failures: {})", node,
               (changed->cordon_until_ms() - clock_->WallNowMs() + 999) / 1000, why,
               changed->failures());
  StoreBatch batch;
  batch.nodes.push_back(*changed);
  Persist(std::move(batch));
  schedule_due_ = true;
}

void Coordinator::CordonSlot(const std::string& node, int slot, const std::string& why, bool slow) {
  std::optional<v1::NodeRecord> changed = nodes_.CordonSlot(node, slot, why, slow);
  const char* cause = slow ? "its rank was a straggler" : "its device failed";
  if (!changed) return;
  for (const v1::SlotFault& f : changed->slot_faults()) {
    if (f.slot() != slot) continue;
    spdlog::warn(
        "node {} slot {} cordoned for {} s, the rest of the node stays in use: {}: {} (its "
        "failures: {})",
        node, slot, (f.cordon_until_ms() - clock_->WallNowMs() + 999) / 1000, cause, why,
        f.failures());
  }
  StoreBatch batch;
  batch.nodes.push_back(*changed);
  Persist(std::move(batch));
  schedule_due_ = true;
}

void Coordinator::TakeSlotHealth(
    const std::string& node, const google::protobuf::RepeatedPtrField<v1::SlotHealth>& unhealthy) {
  const v1::NodeRecord* record = nodes_.Find(node);
  if (record == nullptr || (unhealthy.empty() && record->unhealthy_slots().empty() &&
                            record->cleared_latches().empty())) {
    return;
  }
  const auto before = record->unhealthy_slots();  // rarely more than empty
  bool changed = false;
  for (const v1::SlotHealth& h : nodes_.TakeHealth(node, unhealthy, &changed)) {
    const std::string why = "its GPU failed the node's health check: " + h.fault();
    CordonSlot(node, h.slot(), why);  // counts the failure: a GPU that comes and goes waits longer
    jobs_.OnSlotFailed(node, h.slot(), why);
  }
  if (!changed) return;
  for (const v1::SlotHealth& h : before) {
    const auto& now = record->unhealthy_slots();
    if (std::none_of(now.begin(), now.end(),
                     [&](const v1::SlotHealth& n) { return n.slot() == h.slot(); })) {
      spdlog::info("node {} slot {}: its GPU passes the node's health check again", node, h.slot());
    }
  }
  schedule_due_ = true;  // a slot may be back
}

void Coordinator::Persist(StoreBatch batch) {
  last_write_seq_ = std::max(last_write_seq_, writer_->Commit(std::move(batch)));
}

int64_t Coordinator::Propose(StoreBatch batch) {
  const int64_t seq = writer_->Propose(std::move(batch));
  last_write_seq_ = std::max(last_write_seq_, seq);
  return seq;
}

Status Coordinator::Refused(const std::string& what, const Status& error) const {
  spdlog::warn("{}: the state store refused the write: {}", what, error.ToString());
  return Status(error.code(),
                what + ": cannot record it in " + StateDb(options_) + ": " + error.message());
}

Status Coordinator::Restore(const StoreContents& contents) {
  MutexLock lock(&mu_);
  auto salt = contents.counters.find(kSaltCounter);
  if (salt != contents.counters.end()) {
    id_salt_ = static_cast<uint32_t>(salt->second);
  } else {
    id_salt_ = std::random_device{}() & 0xffffu;
    StoreBatch batch;
    batch.counters[kSaltCounter] = id_salt_;
    Persist(std::move(batch));
  }
  const int64_t now = clock_->NowMs();
  for (const auto& node : contents.nodes) {
    nodes_.Restore(node);
    // A fresh lease: the node's agent gets a full heartbeat timeout to reconnect.
    if (node.state() != v1::NODE_DEAD) health_.OnHeartbeat(node.name(), now);
  }
  jobs_.Restore(contents.jobs, contents.attempts);
  for (const auto& c : contents.checkpoints) checkpoints_.Add(c);
  for (const auto& job : contents.jobs) {
    next_submit_seq_ = std::max(next_submit_seq_, job.submit_seq() + 1);
    if (job.state() == v1::RUNNING) rendezvous_.OpenAttempt(job.job_id(), job.attempt());
  }
  spdlog::info("state restored from {}: {} jobs, {} nodes, {} checkpoints", options_.state_dir,
               contents.jobs.size(), contents.nodes.size(), contents.checkpoints.size());
  return OkStatus();
}

void Coordinator::SetAdvertisedAddress(const std::string& address) {
  MutexLock lock(&mu_);
  jobs_.set_coordinator_address(address);
}

void Coordinator::ObserveTrainers(const std::string& node) {
  // Copy: JobManager's reactions never change the node's listing, but keep it obvious.
  const std::vector<v1::TrainerStatus> listed = *nodes_.Trainers(node);
  const int64_t now = clock_->NowMs();
  for (const auto& t : listed) {
    jobs_.OnTrainerStatus(node, t);
    const TrainerKey key = TrainerKey::Of(t);
    if (IsLive(t) && jobs_.IsCurrent(key)) {
      health_.OnTrainerProgress(key, t.progress().step(), jobs_.HangTimeoutMs(t.job_id()), now);
      if (t.rank() == 0)
        history_.Record(t.job_id(), t.attempt(), t.progress(), clock_->WallNowMs());
    } else {
      health_.ForgetTrainer(key);
    }
  }
  jobs_.OnListing(node, listed);
}

StatusOr<v1::RegisterResponse> Coordinator::Register(const v1::RegisterRequest& request) {
  if (request.name().empty() || request.agent_id().empty()) {
    return InvalidArgumentError("register: name and agent_id are required");
  }
  if (request.slots_size() == 0) return InvalidArgumentError("register: a node needs slots");
  RETURN_IF_ERROR(CheckRegistration(request));
  {
    MutexLock lock(&mu_);
    if (nodes_.Stale(request.name(), request.agent_id(), request.seq())) {
      // Its agent has registered or heartbeated since; it gave up on this one long ago.
      spdlog::info("ignored a registration of {} that arrived late (seq {})", request.name(),
                   request.seq());
      return AbortedError("a registration that arrived after a newer request of its agent");
    }
    if (std::string conflict = nodes_.RegistrationConflict(request); !conflict.empty()) {
      spdlog::warn("refused registration of agent {}: {}", request.agent_id(), conflict);
      return AlreadyExistsError(conflict);
    }
    StoreBatch batch;
    batch.nodes.push_back(nodes_.Register(request));
    Persist(std::move(batch));
    TakeSlotHealth(request.name(), request.unhealthy_slots());
    health_.OnHeartbeat(request.name(), clock_->NowMs());
    ObserveTrainers(request.name());
    schedule_due_ = true;
  }
  spdlog::info("node {} registered: {} slots, agent {}, {} trainers running", request.name(),
               request.slots_size(), request.agent_id(), request.running_size());
  v1::RegisterResponse response;
  response.set_heartbeat_interval_ms(static_cast<int32_t>(options_.heartbeat_interval_ms));
  response.set_heartbeat_timeout_ms(static_cast<int32_t>(options_.heartbeat_timeout_ms));
  return response;
}

v1::HeartbeatResponse Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  MutexLock lock(&mu_);
  if (!nodes_.Accepts(request.name(), request.agent_id())) {
    response.set_reregister(true);
    return response;
  }
  if (nodes_.Stale(request.name(), request.agent_id(), request.seq())) {
    // Sent before a request already taken, and given up on by its agent: its listing is
    // older than the node's, and taking it would report the trainers started since as
    // vanished. No orders either: nobody waits for this reply.
    spdlog::info("ignored a heartbeat of {} that arrived late (seq {})", request.name(),
                 request.seq());
    return response;
  }
  health_.OnHeartbeat(request.name(), clock_->NowMs());
  const bool was_schedulable = nodes_.Schedulable(request.name());
  const int was_live = LiveTrainers(*nodes_.Trainers(request.name()));
  if (auto changed = nodes_.OnHeartbeat(request)) {
    StoreBatch batch;
    batch.nodes.push_back(*changed);
    Persist(std::move(batch));
  }
  TakeSlotHealth(request.name(), request.unhealthy_slots());
  // Slots may be free now: a restored node's first heartbeat or a dead node's return
  // offers its slots again; a trainer listed as exited (or no longer listed) frees one.
  if ((!was_schedulable && nodes_.Schedulable(request.name())) ||
      LiveTrainers(*nodes_.Trainers(request.name())) < was_live) {
    schedule_due_ = true;
  }
  ObserveTrainers(request.name());
  for (const auto& c : request.checkpoints()) {
    if (jobs_.OnCheckpoint(c) && checkpoints_.Add(c)) {
      StoreBatch batch;
      batch.checkpoints.push_back(c);
      Persist(std::move(batch));
    }
  }
  jobs_.AppendOrders(request.name(), *nodes_.Trainers(request.name()), response.mutable_orders(),
                     [this](const std::string& job)
                         REQUIRES(mu_) { return !undurable_attempts_.count(job); });
  *response.mutable_cleared_latches() = nodes_.Find(request.name())->cleared_latches();
  return response;
}

Status Coordinator::ReportTrainerExit(const v1::TrainerExitRequest& request) {
  MutexLock lock(&mu_);
  if (!nodes_.Accepts(request.name(), request.agent_id())) {
    return FailedPreconditionError("unknown agent " + request.agent_id() + " on node " +
                                   request.name() + "; register first");
  }
  nodes_.UpdateTrainer(request.name(), request.trainer());
  jobs_.OnTrainerStatus(request.name(), request.trainer());
  health_.ForgetTrainer(TrainerKey::Of(request.trainer()));
  schedule_due_ = true;  // a survivor's exit frees its slot
  return OkStatus();
}

Status Coordinator::WatchOpened(const v1::WatchRequest& request) {
  MutexLock lock(&mu_);
  if (!nodes_.Accepts(request.name(), request.agent_id())) {
    return FailedPreconditionError("unknown agent " + request.agent_id() + " on node " +
                                   request.name() + "; register first");
  }
  return OkStatus();
}

void Coordinator::WatchClosed(const v1::WatchRequest& request) {
  MutexLock lock(&mu_);
  // A connection of an agent the node no longer knows (replaced, or already dead) says
  // nothing about the node.
  if (!nodes_.Accepts(request.name(), request.agent_id())) return;
  spdlog::info("node {}: agent connection closed; dead unless it heartbeats within {} ms",
               request.name(), options_.connection_grace_ms);
  health_.OnConnectionLost(request.name(), clock_->NowMs(), options_.connection_grace_ms);
}

void Coordinator::OnDurable(int64_t seq) {
  MutexLock lock(&mu_);
  for (auto it = undurable_attempts_.begin(); it != undurable_attempts_.end();) {
    if (it->second > seq) {
      ++it;
      continue;
    }
    NudgeNodesOf(it->first);  // its start orders may go now
    it = undurable_attempts_.erase(it);
  }
}

void Coordinator::SetNudge(std::function<void(const std::string& node)> nudge) {
  MutexLock lock(&mu_);
  nudge_ = std::move(nudge);
}

void Coordinator::NudgeNodesOf(const std::string& job_id) {
  const v1::JobRecord* rec = jobs_.Find(job_id);
  if (!nudge_ || !rec) return;
  std::set<std::string> nodes;
  for (const auto& r : rec->placement()) nodes.insert(r.node());
  for (const std::string& node : nodes) nudge_(node);
}

Status Coordinator::AppendLogs(const v1::AppendLogsRequest& request) {
  if (request.data().size() > kMaxLogChunkBytes) {
    return InvalidArgumentError("append logs: the chunk is " +
                                std::to_string(request.data().size()) + " bytes; at most " +
                                std::to_string(kMaxLogChunkBytes) + " are accepted per call");
  }
  {
    MutexLock lock(&mu_);
    // The job was deleted (drover rm or its retention) while its agent still shipped the
    // tail of a log: accepted and dropped, so the agent moves on and no log reappears.
    if (!jobs_.Find(request.job_id())) return OkStatus();
  }
  return logs_.Append(request.job_id(), request.attempt(), request.rank(), request.offset(),
                      request.data());
}

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
    const int64_t submit_seq = next_submit_seq_;
    ASSIGN_OR_RETURN(job, jobs_.PrepareSubmit(request.spec_yaml(), request.priority(),
                                              MakeJobId(submit_seq, id_salt_), submit_seq));
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

StatusOr<v1::UncordonResponse> Coordinator::Uncordon(const v1::UncordonRequest& request) {
  const int slot = request.slot_only() ? request.slot() : -1;
  const std::string what = "node " + request.node() +
                           (slot >= 0 ? " slot " + std::to_string(slot) : std::string()) +
                           " not uncordoned";
  // As a cancel: if the node changed under the write (a failure, a re-registration), its
  // newer record was queued after this one and wins on disk; plan again from it.
  constexpr int kTries = 10;
  for (int i = 0; i < kTries; ++i) {
    NodeManager::UncordonPlan plan;
    int64_t seq;
    {
      MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(plan, nodes_.PlanUncordon(request.node(), slot));
      StoreBatch batch;
      batch.nodes.push_back(plan.after);
      seq = Propose(std::move(batch));
    }
    if (Status st = writer_->WaitProposal(seq); !st.ok()) return Refused(what, st);
    MutexLock lock(&mu_);
    if (!nodes_.ApplyUncordon(plan)) continue;
    spdlog::info("{}{} put back in service by an operator{}", request.node(),
                 slot >= 0 ? " slot " + std::to_string(slot) : std::string(),
                 plan.was_cordoned ? "" : " (it was not cordoned)");
    schedule_due_ = true;
    v1::UncordonResponse response;
    *response.mutable_node() = *nodes_.Find(request.node());
    response.set_was_cordoned(plan.was_cordoned);
    return response;
  }
  return UnavailableError(what + ": it changed " + std::to_string(kTries) +
                          " times while being uncordoned; try again");
}

StatusOr<int64_t> Coordinator::CheckpointJob(const std::string& job_id) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(int64_t after, jobs_.RequestCheckpoint(job_id, "requested by a user"));
  NudgeNodesOf(job_id);
  return after;
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

std::vector<int> Coordinator::BusySlots(const std::string& node) const {
  // A slot is busy while a current attempt holds it, and also while its agent still lists
  // a live trainer there (a stopped attempt's survivor keeps its slot until it exits).
  std::vector<int> busy = jobs_.ReservedSlots(node);
  AppendListedSlots(node, &busy);
  return busy;
}

void Coordinator::ForEachFreeSlot(const std::string& name, const v1::NodeRecord& rec,
                                  int64_t now_ms, const std::function<bool(const v1::Slot&)>& free,
                                  const std::function<void(const v1::Slot&)>& releasing) const {
  std::vector<int> busy = jobs_.ReservedSlots(name);
  // Full nodes are the common case while jobs queue: skip them before the listing walk.
  if (static_cast<int>(busy.size()) >= rec.slots_size()) return;
  const size_t reserved = busy.size();
  AppendListedSlots(name, &busy);
  auto in = [&](size_t to, int s) {
    return std::find(busy.begin(), busy.begin() + static_cast<std::ptrdiff_t>(to), s) !=
           busy.begin() + static_cast<std::ptrdiff_t>(to);
  };
  for (const v1::Slot& s : rec.slots()) {
    // A slot out of use (cordoned, or its GPU reported unfit) is neither free nor about to
    // be: the trainer that still holds it gives back a GPU that failed.
    if (SlotOut(rec, s.index(), now_ms)) continue;
    if (in(busy.size(), s.index())) {
      if (releasing && !in(reserved, s.index())) releasing(s);
      continue;
    }
    if (!free(s)) return;
  }
}

bool Coordinator::HasFreeSlot(v1::DeviceKind device) const {
  const int64_t now = clock_->WallNowMs();
  bool found = false;
  nodes_.ForEach([&](const std::string& name, const v1::NodeRecord& rec, bool schedulable)
                     REQUIRES(mu_) {
                       if (found || !schedulable) return;
                       ForEachFreeSlot(name, rec, now, [&](const v1::Slot& s) {
                         found = (s.device() == v1::CUDA) == (device == v1::CUDA);
                         return !found;
                       });
                     });
  return found;
}

void Coordinator::AppendListedSlots(const std::string& node, std::vector<int>* slots) const {
  for (const auto& t : *nodes_.Trainers(node)) {
    if (!IsLive(t)) continue;
    if (auto slot = jobs_.SlotOf(node, TrainerKey::Of(t))) slots->push_back(*slot);
  }
}

v1::ListWorkersResponse Coordinator::ListWorkers(const v1::ListWorkersRequest& request) {
  v1::ListWorkersResponse response;
  MutexLock lock(&mu_);
  const int64_t now = clock_->WallNowMs();
  response.set_now_ms(now);
  nodes_.ForEach(
      [&](const std::string& name, const v1::NodeRecord& rec, bool schedulable) REQUIRES(mu_) {
        v1::WorkerInfo* w = response.add_workers();
        *w->mutable_node() = rec;
        // What a dead node's agent listed last says nothing about what runs there now.
        const bool dead = rec.state() == v1::NODE_DEAD;
        for (const auto& t : *nodes_.Trainers(name)) {
          if (request.include_exited() || (!dead && IsLive(t))) *w->add_trainers() = t;
        }
        if (!dead) {
          for (const v1::GpuTelemetry& g : *nodes_.Gpus(name)) *w->add_gpus() = g;
        }
        int free = 0;
        if (schedulable) {
          const std::vector<int> busy = BusySlots(name);
          for (const auto& s : rec.slots()) {
            const bool held = std::find(busy.begin(), busy.end(), s.index()) != busy.end();
            free += !held && !SlotOut(rec, s.index(), now) ? 1 : 0;
          }
        }
        w->set_free_slots(free);
      });
  return response;
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

void Coordinator::ScheduleLocked() {
  schedule_due_ = false;
  last_schedule_ms_ = clock_->NowMs();
  std::vector<PendingJob> pending = jobs_.Pending();
  std::vector<RunningJob> running = jobs_.Resizable();
  const bool growable = std::any_of(running.begin(), running.end(), [](const RunningJob& j) {
    return j.world_size < j.feasible_world_sizes.back();
  });
  if (pending.empty() && !growable) {
    // Nothing to place and nothing to grow: a plan made by an earlier pass is withdrawn.
    for (const RunningJob& j : running) jobs_.PlanResize(j.job_id, std::nullopt);
    return;
  }
  std::vector<NodeCapacity> capacity;
  std::map<v1::DeviceKind, int64_t> ever;
  std::map<v1::DeviceKind, int64_t> releasing;  // held by trainers of ended attempts
  for (v1::DeviceKind d : {v1::CPU, v1::CUDA}) ever[d] = nodes_.TotalSlotsEver(d);
  const int64_t now = clock_->WallNowMs();
  nodes_.ForEach([&](const std::string& name, const v1::NodeRecord& rec,
                     bool schedulable) REQUIRES(mu_) {
    if (!schedulable) return;
    // A node offers one device kind per slot; group its free slots per kind.
    NodeCapacity per_device[2];  // CPU, CUDA
    const auto kind = [](const v1::Slot& s) { return s.device() == v1::CUDA ? v1::CUDA : v1::CPU; };
    ForEachFreeSlot(
        name, rec, now,
        [&](const v1::Slot& s) {
          NodeCapacity& c = per_device[kind(s) == v1::CUDA ? 1 : 0];
          c.device = kind(s);
          c.free_slots.push_back(s.index());
          return true;
        },
        [&](const v1::Slot& s) { ++releasing[kind(s)]; });
    for (NodeCapacity& c : per_device) {
      if (c.free_slots.empty()) continue;
      c.name = name;
      std::sort(c.free_slots.begin(), c.free_slots.end());
      capacity.push_back(std::move(c));
    }
  });
  ScheduleResult result = Schedule(std::move(pending), std::move(capacity), ever);
  for (const Placement& p : result.placements) {
    jobs_.StartAttempt(p, checkpoints_.Newest(p.job_id));
  }
  // Growth goes only where no job waits, preemption only where one does: a job gets at
  // most one of the two plans.
  std::map<std::string, int> grow = PlanGrowth(running, result);
  std::map<std::string, ResizePlan> preempt = PlanPreemption(running, result, releasing);
  std::map<std::string, std::string> making_room;  // blocked job -> the jobs preempted for it
  for (const RunningJob& j : running) {
    std::optional<ResizePlan> plan;
    if (auto it = preempt.find(j.job_id); it != preempt.end()) {
      plan = it->second;
      std::string& names = making_room[plan->for_job.job_id];
      names += (names.empty() ? "" : ", ") + j.job_id;
    } else if (grow[j.job_id] > 0) {
      plan = ResizePlan{grow[j.job_id], {}};
    }
    if (jobs_.PlanResize(j.job_id, std::move(plan))) NudgeNodesOf(j.job_id);  // "checkpoint now"
  }
  for (auto [job, why] : result.waiting) {
    if (auto it = making_room.find(job); it != making_room.end()) {
      why += "; lower-priority jobs make room at their next checkpoints: " + it->second;
    }
    jobs_.SetWaitingReason(job, why);
  }
}

void Coordinator::Tick() {
  std::vector<std::string> expired;
  {
    MutexLock lock(&mu_);
    TickLocked();
    expired = ExpireJobsLocked();
  }
  // Off the state lock: deleting files is disk I/O.
  for (const std::string& id : expired) {
    if (Status st = logs_.Remove(id); !st.ok()) spdlog::warn("{}", st.ToString());
  }
}

void Coordinator::TickLocked() {
  HealthManager::Events events = health_.Tick(clock_->NowMs());
  for (const std::string& node : events.dead_nodes) {
    if (auto rec = nodes_.MarkDead(node)) {
      spdlog::warn("node {} is dead: no heartbeat for {} ms (failures: {})", node,
                   options_.heartbeat_timeout_ms, rec->failures());
      StoreBatch batch;
      batch.nodes.push_back(*rec);
      Persist(std::move(batch));
    }
    jobs_.OnNodeLost(node, "is dead (no heartbeat for " +
                               std::to_string(options_.heartbeat_timeout_ms) + " ms)");
  }
  for (const TrainerKey& key : events.hung) jobs_.OnHang(key);
  for (auto& rec : nodes_.ExpireCordons()) {
    StoreBatch batch;
    batch.nodes.push_back(std::move(rec));
    Persist(std::move(batch));
    schedule_due_ = true;
  }
  for (const std::string& job : jobs_.CheckStragglers(
           clock_->WallNowMs(),
           [this](v1::DeviceKind device) REQUIRES(mu_) { return HasFreeSlot(device); })) {
    NudgeNodesOf(job);  // "checkpoint now"
  }
  if (!events.dead_nodes.empty()) schedule_due_ = true;
  if (clock_->WallNowMs() >= jobs_.NextRestartMs()) schedule_due_ = true;  // a delay is over
  if (schedule_due_ || clock_->NowMs() - last_schedule_ms_ >= kScheduleFallbackMs) {
    ScheduleLocked();
  }
}

Status Coordinator::Flush() {
  int64_t seq;
  {
    MutexLock lock(&mu_);
    seq = last_write_seq_;
  }
  return writer_->WaitDurable(seq);
}

}  // namespace drover::coordinator
