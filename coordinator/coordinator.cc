// The coordinator's life (opening, restoring, persisting), the decisions its ticker makes
// (deaths, hangs, cordons, stragglers, scheduling) and the slot bookkeeping they share. The
// RPC handlers are beside it: the workers' in coordinator_workers.cc, the jobs' in
// coordinator_jobs.cc.
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
#include "coordinator/store/sqlite_store.h"

namespace drover::coordinator {
namespace {

constexpr char kSaltCounter[] = "job_id_salt";

std::string StateDb(const CoordinatorOptions& options) { return options.state_dir + "/state.db"; }

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
  bool held_back = false;
  std::optional<v1::NodeRecord> changed = nodes_.CordonCutOff(node, &held_back);
  if (!changed) return;
  if (held_back) {
    WarnCordonHeldBack(node, why, changed->failures());
  } else {
    spdlog::warn("node {} cordoned for {} s: {} (its failures: {})", node,
                 (changed->cordon_until_ms() - clock_->WallNowMs() + 999) / 1000, why,
                 changed->failures());
  }
  StoreBatch batch;
  batch.nodes.push_back(*changed);
  Persist(std::move(batch));
  schedule_due_ = true;
}

void Coordinator::WarnCordonHeldBack(const std::string& node, const std::string& why,
                                     int failures) const {
  spdlog::warn(
      "node {} not cordoned, though it has failed {} times ({}): as many nodes are cordoned "
      "already as --max-cordoned-share {} allows; so many failing together points at what "
      "they share (the network, the coordinator), so the node stays in use",
      node, failures, why, options_.nodes.max_cordoned_share);
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

void Coordinator::CountHeldSlots(std::vector<PendingJob>* pending, int64_t now_ms) const {
  std::map<std::string, std::set<std::pair<std::string, int>>> held;  // job -> (node, slot)
  for (const PendingJob& p : *pending) {
    if (p.regrouping) held[p.job_id];
  }
  if (held.empty()) return;  // the common case: no walk over every node
  nodes_.ForEach([&](const std::string& name, const v1::NodeRecord& rec, bool schedulable)
                     REQUIRES(mu_) {
                       if (!schedulable) return;
                       for (const auto& t : *nodes_.Trainers(name)) {
                         auto it = held.find(t.job_id());
                         if (it == held.end() || !IsLive(t)) continue;
                         auto slot = jobs_.SlotOf(name, TrainerKey::Of(t));
                         if (slot && !SlotOut(rec, *slot, now_ms)) it->second.emplace(name, *slot);
                       }
                     });
  for (PendingJob& p : *pending) {
    if (p.regrouping) p.held_slots = static_cast<int>(held[p.job_id].size());
  }
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
  CountHeldSlots(&pending, now);
  ScheduleResult result = Schedule(pending, std::move(capacity), ever);
  // Growth goes only where no job waits, preemption only where one does: a job gets at
  // most one of the two plans.
  std::map<std::string, int> grow = PlanGrowth(running, result);
  std::map<std::string, ResizePlan> preempt = PlanPreemption(running, result, releasing);
  // Backfill where no job makes room for the blocked one: backfilling there would only give
  // the preemption more to take back. Slots that ended attempts still hold are back at once.
  std::set<v1::DeviceKind> preempting;
  for (const auto& [device, head] : result.blocked) {
    for (const auto& [id, plan] : preempt) {
      if (plan.for_job.job_id == head.job_id) preempting.insert(device);
    }
  }
  std::vector<SlotRelease> releases = jobs_.TimedReleases();
  for (const auto& [device, slots] : releasing) releases.push_back({device, slots, 0});
  Backfill(std::move(pending), releases, preempting, &result);
  for (const Placement& p : result.placements) {
    jobs_.StartAttempt(p, checkpoints_.Newest(p.job_id));
  }
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
    bool held_back = false;
    if (auto rec = nodes_.MarkDead(node, &held_back)) {
      spdlog::warn("node {} is dead: no heartbeat for {} ms (failures: {})", node,
                   options_.heartbeat_timeout_ms, rec->failures());
      if (held_back) WarnCordonHeldBack(node, "it died again", rec->failures());
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
  for (const std::string& job : jobs_.CheckTimeLimits(clock_->WallNowMs())) {
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
