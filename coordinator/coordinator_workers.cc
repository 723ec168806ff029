// Coordinator's WorkerService: what agents send (registrations, heartbeats, trainer exits,
// their connections, logs), and what operators ask of nodes (ListWorkers, Cordon, Uncordon).
// coordinator.h states the contract.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/mutex.h"
#include "common/node_slots.h"
#include "common/protocol_version.h"
#include "coordinator/coordinator.h"
#include "coordinator/limits.h"

namespace drover::coordinator {
namespace {

// The log's account of what a drain moves off a node or slot: "; 2 jobs leave it, 1 at a
// checkpoint saved now, 1 starting again from step 0 (saving no checkpoints)", or nothing.
std::string LeavingJobs(const v1::CordonResponse& response) {
  const int n = response.jobs_size();
  if (n == 0) return "";
  const auto& saves = response.jobs_checkpoint();
  const int saving = static_cast<int>(std::count(saves.begin(), saves.end(), true));
  const std::string out = "; " + std::to_string(n) + (n == 1 ? " job leaves it" : " jobs leave it");
  if (saving == n) return out + ", at a checkpoint saved now";
  if (saving == 0) return out + ", starting again from step 0 (saving no checkpoints)";
  return out + ", " + std::to_string(saving) + " at a checkpoint saved now, " +
         std::to_string(n - saving) + " starting again from step 0 (saving no checkpoints)";
}

// CordonRequest.grace_ms: a whole node's drain's, from 0 to a day.
Status CheckDrainGrace(const v1::CordonRequest& request) {
  constexpr int32_t kMaxDrainGraceMs = 24 * 3600 * 1000;
  const int32_t grace = request.grace_ms();
  if (grace == 0) return OkStatus();
  if (grace < 0 || grace > kMaxDrainGraceMs) {
    return InvalidArgumentError("drain: a grace of " + std::to_string(grace) +
                                " ms is out of range (0 to a day)");
  }
  if (!request.drain()) {
    return InvalidArgumentError("cordon: a grace applies to a drain only (a cordon stops nothing)");
  }
  if (request.slot_only()) {
    return InvalidArgumentError(
        "drain: a grace applies to a whole node's drain only: a slot's rank moves at a "
        "checkpoint its job saves while it trains on, and is then stopped as any attempt's");
  }
  return OkStatus();
}

int LiveTrainers(const std::vector<v1::TrainerStatus>& listed) {
  return static_cast<int>(std::count_if(listed.begin(), listed.end(), IsLive));
}

// Names, addresses and slots of a registering node within limits.h's bounds.
Status CheckRegistration(const v1::RegisterRequest& r) {
  if (r.protocol_version() != kProtocolVersion) {
    return FailedPreconditionError(
        "register: the agent speaks drover protocol " + std::to_string(r.protocol_version()) +
        " and this coordinator protocol " + std::to_string(kProtocolVersion) +
        " (common/protocol_version.h): run the agents and the coordinator of one release");
  }
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

}  // namespace

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

void Coordinator::ObserveTrainers(const std::string& node) {
  // Copy: JobManager's reactions never change the node's listing, but keep it obvious.
  const std::vector<v1::TrainerStatus> listed = *nodes_.Trainers(node);
  const int64_t now = clock_->NowMs();
  for (const auto& t : listed) {
    jobs_.OnTrainerStatus(node, t);
    const TrainerKey key = TrainerKey::Of(t);
    if (IsLive(t) && jobs_.IsCurrent(key)) {
      health_.OnTrainerProgress(key, t.progress().step(), jobs_.HangTimeoutMs(t.job_id()), now,
                                t.progress().work());
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
  if (request.draining() && was_schedulable) {
    spdlog::info("node {} is draining: its agent is stopping; nothing new is placed on it",
                 request.name());
  }
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
  AppendDrainOrder(request.name(), response.mutable_orders());
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

Status Coordinator::ChangeNode(const std::string& what,
                               const std::function<StatusOr<NodeManager::NodePlan>()>& plan_change,
                               const std::function<void(const NodeManager::NodePlan&)>& applied) {
  // As a cancel: if the node changed under the write (a failure, a re-registration), its
  // newer record was queued after this one and wins on disk; plan again from it.
  constexpr int kTries = 10;
  for (int i = 0; i < kTries; ++i) {
    NodeManager::NodePlan plan;
    int64_t seq;
    {
      MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(plan, plan_change());
      StoreBatch batch;
      batch.nodes.push_back(plan.after);
      seq = Propose(std::move(batch));
    }
    if (Status st = writer_->WaitProposal(seq); !st.ok()) return Refused(what, st);
    MutexLock lock(&mu_);
    if (!nodes_.ApplyPlan(plan)) continue;
    applied(plan);
    return OkStatus();
  }
  return UnavailableError(what + ": it changed " + std::to_string(kTries) +
                          " times meanwhile; try again");
}

StatusOr<v1::UncordonResponse> Coordinator::Uncordon(const v1::UncordonRequest& request) {
  const int slot = request.slot_only() ? request.slot() : -1;
  const std::string where =
      request.node() + (slot >= 0 ? " slot " + std::to_string(slot) : std::string());
  v1::UncordonResponse response;
  RETURN_IF_ERROR(ChangeNode(
      "node " + where + " not uncordoned",
      [&]() REQUIRES(mu_) { return nodes_.PlanUncordon(request.node(), slot); },
      [&](const NodeManager::NodePlan& plan) REQUIRES(mu_) {
        spdlog::info("{} put back in service by an operator{}", where,
                     plan.was_cordoned ? "" : " (it was not cordoned)");
        schedule_due_ = true;
        *response.mutable_node() = *nodes_.Find(request.node());
        response.set_was_cordoned(plan.was_cordoned);
      }));
  return response;
}

StatusOr<v1::CordonResponse> Coordinator::Cordon(const v1::CordonRequest& request) {
  RETURN_IF_ERROR(CheckLength("cordon: the reason", request.reason(), kMaxReasonBytes));
  RETURN_IF_ERROR(CheckLength("cordon: the requester", request.requester(), kMaxReasonBytes));
  if (request.slot_only() && request.slot() < 0) {
    return InvalidArgumentError("cordon: slot " + std::to_string(request.slot()) +
                                " is not a slot index (0 or more)");
  }
  RETURN_IF_ERROR(CheckDrainGrace(request));
  const char* verb = request.drain() ? "drained" : "cordoned";
  std::string why = std::string(verb) + " by " +
                    (request.requester().empty() ? "an operator" : request.requester());
  if (!request.reason().empty()) why += ": " + request.reason();
  const int slot = request.slot_only() ? request.slot() : -1;
  const std::string what =
      "node " + request.node() + (slot >= 0 ? " slot " + std::to_string(slot) : "");
  v1::CordonResponse response;
  RETURN_IF_ERROR(ChangeNode(
      what + " not " + verb,
      [&]() REQUIRES(mu_) {
        return nodes_.PlanCordon(request.node(), request.drain(), why, slot, request.grace_ms());
      },
      [&](const NodeManager::NodePlan& plan) REQUIRES(mu_) {
        *response.mutable_node() = *nodes_.Find(request.node());
        if (request.drain() && slot >= 0 && plan.after.state() != v1::NODE_DEAD) {
          bool checkpoints = false;
          const std::string job = jobs_.PlanSlotDrain(
              request.node(), slot, why,
              [this](v1::DeviceKind device) REQUIRES(mu_) { return HasFreeSlot(device); },
              &checkpoints);
          if (!job.empty()) {
            response.add_jobs(job);
            response.add_jobs_checkpoint(checkpoints);
            NudgeNodesOf(job);  // its agents heartbeat now: the replies ask the checkpoint
          }
        }
        // Only what an alive node runs moves; a dead node's jobs have already failed over.
        if (slot < 0 && plan.after.drain() && plan.after.state() != v1::NODE_DEAD) {
          for (const v1::TrainerStatus& t : *nodes_.Trainers(request.node())) {
            if (!IsLive(t) || !jobs_.IsCurrent(TrainerKey::Of(t))) continue;
            const auto& listed = response.jobs();
            if (std::find(listed.begin(), listed.end(), t.job_id()) != listed.end()) continue;
            response.add_jobs(t.job_id());
            const JobSpec* spec = jobs_.SpecOf(t.job_id());
            response.add_jobs_checkpoint(spec != nullptr && spec->checkpoint.enabled());
          }
          if (nudge_) nudge_(request.node());  // its agent heartbeats now: the reply drains
        }
        spdlog::info("{} {} ({}){}", what, verb, why, LeavingJobs(response));
      }));
  return response;
}

void Coordinator::AppendDrainOrder(const std::string& node,
                                   google::protobuf::RepeatedPtrField<v1::Order>* orders) const {
  const v1::NodeRecord* rec = nodes_.Find(node);
  if (rec == nullptr || !rec->drain() || LiveTrainers(*nodes_.Trainers(node)) == 0) return;
  // The grace drover drain --grace gave, else (0) the agent's --stop-grace-ms, which its
  // operator sized to a checkpoint of the models it trains (it drains with it when stopped),
  // not the coordinator's stop grace.
  v1::DrainTrainersOrder* drain = orders->Add()->mutable_drain();
  drain->set_reason(rec->operator_cordon());
  drain->set_grace_ms(rec->drain_grace_ms());
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
        w->set_draining(nodes_.Draining(name));
      });
  return response;
}
}  // namespace drover::coordinator
