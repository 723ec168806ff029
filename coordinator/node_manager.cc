#include "coordinator/node_manager.h"

#include <algorithm>

#include "coordinator/backoff.h"
#include "coordinator/trainer_key.h"

namespace drover::coordinator {
namespace {

bool HasSlot(const v1::NodeRecord& r, int slot) {
  return std::any_of(r.slots().begin(), r.slots().end(),
                     [slot](const v1::Slot& s) { return s.index() == slot; });
}

// a + b, or INT64_MAX where that would overflow (a remembered time plus a memory).
int64_t SaturatingAdd(int64_t a, int64_t b) { return a > INT64_MAX - b ? INT64_MAX : a + b; }

// Slot `slot`'s entry in `r.slot_faults`, added (empty) where it has none.
v1::SlotFault* FaultOf(v1::NodeRecord& r, int slot) {
  for (v1::SlotFault& f : *r.mutable_slot_faults()) {
    if (f.slot() == slot) return &f;
  }
  v1::SlotFault* fault = r.add_slot_faults();
  fault->set_slot(slot);
  return fault;
}

bool Contains(const google::protobuf::RepeatedField<int64_t>& ids, int64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Whether a node's record is as an uncordon was planned from, but for the time of its last
// heartbeat (which changes in memory at every heartbeat and is written only with other
// changes). Any other change was queued for the disk after the uncordon's proposal, so it
// would win there over the uncordon made here in memory.
bool Unchanged(v1::NodeRecord now, v1::NodeRecord planned) {
  now.clear_last_heartbeat_ms();
  planned.clear_last_heartbeat_ms();
  return now.SerializeAsString() == planned.SerializeAsString();
}

// The state of a node that is not dead: cordoned while a cordon its failures earned lasts
// at wall time `now_ms` or an operator's is in force, else alive.
v1::NodeState LiveState(const v1::NodeRecord& r, int64_t now_ms) {
  return r.cordon_until_ms() > now_ms || !r.operator_cordon().empty() ? v1::NODE_CORDONED
                                                                      : v1::NODE_ALIVE;
}

}  // namespace

NodeManager::NodeManager(const Clock* clock, NodeManagerOptions options)
    : clock_(clock), options_(options) {}

void NodeManager::Restore(const v1::NodeRecord& record) {
  Node& node = nodes_[record.name()];
  node.record = record;
  node.connected = false;
  v1::NodeRecord& r = node.record;
  // A record written before failures had a time (format of protocol 2): its memory starts
  // now, rather than forgetting at once what it counted.
  const int64_t now = clock_->WallNowMs();
  if (r.failures() > 0 && r.last_failure_ms() == 0) r.set_last_failure_ms(now);
  if (r.cordon_until_ms() > 0) {
    next_cordon_check_ms_ = std::min(next_cordon_check_ms_, r.cordon_until_ms());
  }
  next_cordon_check_ms_ = std::min(next_cordon_check_ms_, ForgetNodeFailuresAt(r));
  for (v1::SlotFault& f : *r.mutable_slot_faults()) {
    if (f.failed_ms() == 0) f.set_failed_ms(now);
    if (f.cordon_until_ms() > 0) {
      next_cordon_check_ms_ = std::min(next_cordon_check_ms_, f.cordon_until_ms());
    }
    next_cordon_check_ms_ = std::min(next_cordon_check_ms_, ForgetSlotFaultAt(f));
  }
}

std::string NodeManager::RegistrationConflict(const v1::RegisterRequest& request) const {
  auto it = nodes_.find(request.name());
  if (it == nodes_.end()) return "";
  const v1::NodeRecord& r = it->second.record;
  // Records from before node uids, and agents that send none, cannot be told apart.
  if (r.node_uid().empty() || request.node_uid().empty() || r.node_uid() == request.node_uid()) {
    return "";
  }
  if (r.state() == v1::NODE_DEAD) return "";
  return "node name '" + request.name() + "' is held by a live agent (" + r.agent_id() + " at " +
         r.address() +
         ", another work dir); start this agent with another --name, or stop "
         "that one: its name is free once it has missed heartbeats for the node timeout";
}

v1::NodeRecord NodeManager::Register(const v1::RegisterRequest& request) {
  Node& node = nodes_[request.name()];
  v1::NodeRecord& r = node.record;
  node.seq = request.seq();
  if (r.name().empty()) r.set_registered_ms(clock_->WallNowMs());
  r.set_name(request.name());
  r.set_address(request.address());
  r.mutable_slots()->CopyFrom(request.slots());
  r.set_agent_id(request.agent_id());
  r.set_node_uid(request.node_uid());
  r.set_last_heartbeat_ms(clock_->WallNowMs());
  if (r.cordon_until_ms() <= clock_->WallNowMs()) r.set_cordon_until_ms(0);
  r.set_state(LiveState(r, clock_->WallNowMs()));
  node.connected = true;
  node.draining = false;  // a new agent process
  node.trainers.assign(request.running().begin(), request.running().end());
  return r;
}

bool NodeManager::Accepts(const std::string& name, const std::string& agent_id) const {
  auto it = nodes_.find(name);
  return it != nodes_.end() && it->second.record.agent_id() == agent_id;
}

bool NodeManager::Stale(const std::string& name, const std::string& agent_id, int64_t seq) const {
  auto it = nodes_.find(name);
  return seq > 0 && it != nodes_.end() && it->second.record.agent_id() == agent_id &&
         seq <= it->second.seq;
}

std::optional<v1::NodeRecord> NodeManager::OnHeartbeat(const v1::HeartbeatRequest& request) {
  auto it = nodes_.find(request.name());
  if (it == nodes_.end()) return std::nullopt;
  Node& node = it->second;
  node.seq = std::max(node.seq, request.seq());
  node.connected = true;
  node.draining = request.draining();
  node.record.set_last_heartbeat_ms(clock_->WallNowMs());
  node.trainers.assign(request.trainers().begin(), request.trainers().end());
  node.gpus.assign(request.gpus().begin(), request.gpus().end());
  if (node.record.state() != v1::NODE_DEAD) return std::nullopt;
  // A dead node whose agent kept its id came back (a partition healed).
  node.record.set_state(LiveState(node.record, clock_->WallNowMs()));
  return node.record;
}

void NodeManager::UpdateTrainer(const std::string& name, const v1::TrainerStatus& trainer) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  for (auto& t : it->second.trainers) {
    if (t.job_id() == trainer.job_id() && t.attempt() == trainer.attempt() &&
        t.rank() == trainer.rank()) {
      t = trainer;
      return;
    }
  }
  it->second.trainers.push_back(trainer);
}

std::optional<v1::NodeRecord> NodeManager::MarkDead(const std::string& name, bool* held_back) {
  auto it = nodes_.find(name);
  if (it == nodes_.end() || it->second.record.state() == v1::NODE_DEAD) return std::nullopt;
  Node& node = it->second;
  node.connected = false;
  node.trainers.clear();  // whatever ran there is gone as far as scheduling is concerned
  // An agent that drained its trainers was stopped on purpose (maintenance, an eviction):
  // its node's leaving is no failure, and repeated maintenance must not cordon it.
  if (!node.draining) {
    CountFailure(node);
    if (node.record.failures() >= options_.cordon_after_failures && !Cordon(node) &&
        held_back != nullptr) {
      *held_back = true;
    }
  }
  node.record.set_state(v1::NODE_DEAD);
  return node.record;
}

std::optional<v1::NodeRecord> NodeManager::CordonCutOff(const std::string& name, bool* held_back) {
  auto it = nodes_.find(name);
  if (it == nodes_.end() || it->second.record.state() == v1::NODE_DEAD) return std::nullopt;
  Node& node = it->second;
  CountFailure(node);
  if (Cordon(node)) {
    node.record.set_state(v1::NODE_CORDONED);
  } else if (held_back != nullptr) {
    *held_back = true;
  }
  return node.record;
}

std::optional<v1::NodeRecord> NodeManager::CordonSlot(const std::string& name, int slot,
                                                      const std::string& why, bool slow) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return std::nullopt;
  v1::NodeRecord& r = it->second.record;
  if (!HasSlot(r, slot)) return std::nullopt;
  v1::SlotFault* fault = FaultOf(r, slot);
  const int64_t now = clock_->WallNowMs();
  const int64_t ms =
      DoublingDelayMs(fault->failures(), options_.slot_cordon_base_ms, options_.slot_cordon_max_ms);
  fault->set_failures(fault->failures() + 1);
  if (slow) fault->set_slow(fault->slow() + 1);
  fault->set_cordon_until_ms(now + ms);
  fault->set_reason(why);
  fault->set_failed_ms(now);
  next_cordon_check_ms_ = std::min(next_cordon_check_ms_, fault->cordon_until_ms());
  next_cordon_check_ms_ = std::min(next_cordon_check_ms_, ForgetSlotFaultAt(*fault));
  return r;
}

std::vector<v1::SlotHealth> NodeManager::TakeHealth(
    const std::string& name, const google::protobuf::RepeatedPtrField<v1::SlotHealth>& unhealthy,
    bool* changed) {
  std::vector<v1::SlotHealth> first;
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return first;
  v1::NodeRecord& r = it->second.record;
  google::protobuf::RepeatedPtrField<v1::SlotHealth> now;
  google::protobuf::RepeatedField<int64_t> still_cleared;
  for (const v1::SlotHealth& h : unhealthy) {
    if (!HasSlot(r, h.slot())) continue;
    if (h.latch() != 0 && Contains(r.cleared_latches(), h.latch())) {
      still_cleared.Add(h.latch());
      continue;
    }
    *now.Add() = h;
    const bool known =
        std::any_of(r.unhealthy_slots().begin(), r.unhealthy_slots().end(),
                    [&](const v1::SlotHealth& was) { return was.slot() == h.slot(); });
    if (!known) first.push_back(h);
  }
  const bool same = now.size() == r.unhealthy_slots().size() &&
                    std::equal(now.begin(), now.end(), r.unhealthy_slots().begin(),
                               [](const v1::SlotHealth& a, const v1::SlotHealth& b) {
                                 return a.SerializeAsString() == b.SerializeAsString();
                               });
  if (changed != nullptr) *changed = !same;
  if (!same) r.mutable_unhealthy_slots()->Swap(&now);
  if (still_cleared.size() != r.cleared_latches().size()) {
    r.mutable_cleared_latches()->Swap(&still_cleared);
  }
  return first;
}

StatusOr<NodeManager::NodePlan> NodeManager::PlanUncordon(const std::string& name, int slot) const {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return NotFoundError("no node " + name);
  NodePlan plan{it->second.record, it->second.record};
  v1::NodeRecord& r = plan.after;
  const int64_t now = clock_->WallNowMs();
  if (slot >= 0) {
    if (!HasSlot(r, slot)) {
      return NotFoundError("node " + name + " has no slot " + std::to_string(slot) + " (it has " +
                           std::to_string(r.slots_size()) + ")");
    }
    for (const v1::SlotHealth& h : r.unhealthy_slots()) {
      if (h.slot() != slot || h.latch() != 0) continue;
      return FailedPreconditionError(
          "node " + name + " slot " + std::to_string(slot) +
          " stays out of use while its agent's health check reports its GPU unfit (" + h.fault() +
          "); it returns to service by itself once the check passes");
    }
  } else {
    plan.was_cordoned =
        r.state() == v1::NODE_CORDONED || r.cordon_until_ms() > now || !r.operator_cordon().empty();
    if (r.state() == v1::NODE_CORDONED) r.set_state(v1::NODE_ALIVE);
    r.set_cordon_until_ms(0);
    r.set_failures(0);
    r.set_last_failure_ms(0);
    r.clear_operator_cordon();
    r.clear_operator_cordon_ms();
    r.clear_drain();
    r.clear_drain_grace_ms();
  }
  // A latch ends only so. The slot is in use from now; the agent hears of it with its next
  // heartbeat's reply, and reports the latch until then (TakeHealth leaves it out).
  auto* unhealthy = r.mutable_unhealthy_slots();
  for (int i = unhealthy->size() - 1; i >= 0; --i) {
    const v1::SlotHealth& h = unhealthy->Get(i);
    if (h.latch() == 0 || (slot >= 0 && h.slot() != slot)) continue;
    if (!Contains(r.cleared_latches(), h.latch())) r.add_cleared_latches(h.latch());
    plan.was_cordoned = true;
    unhealthy->DeleteSubrange(i, 1);
  }
  auto* faults = r.mutable_slot_faults();
  for (int i = faults->size() - 1; i >= 0; --i) {
    if (slot >= 0 && faults->Get(i).slot() != slot) continue;
    plan.was_cordoned = plan.was_cordoned || faults->Get(i).cordon_until_ms() > now ||
                        !faults->Get(i).operator_cordon().empty();
    faults->DeleteSubrange(i, 1);
  }
  return plan;
}

StatusOr<NodeManager::NodePlan> NodeManager::PlanCordon(const std::string& name, bool drain,
                                                        const std::string& why, int slot,
                                                        int drain_grace_ms) const {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return NotFoundError("no node " + name);
  NodePlan plan{it->second.record, it->second.record};
  v1::NodeRecord& r = plan.after;
  if (slot >= 0) {
    if (!HasSlot(r, slot)) {
      return NotFoundError("node " + name + " has no slot " + std::to_string(slot) + " (it has " +
                           std::to_string(r.slots_size()) + ")");
    }
    v1::SlotFault* fault = FaultOf(r, slot);
    plan.was_cordoned = !fault->operator_cordon().empty();
    fault->set_operator_cordon(why.empty() ? "cordoned by an operator" : why);
    if (!plan.was_cordoned) fault->set_operator_cordon_ms(clock_->WallNowMs());
    return plan;
  }
  plan.was_cordoned = !r.operator_cordon().empty();
  // The reason is what the operator sees in drover workers: never empty once cordoned.
  r.set_operator_cordon(why.empty() ? "cordoned by an operator" : why);
  if (!plan.was_cordoned) r.set_operator_cordon_ms(clock_->WallNowMs());
  r.set_drain(r.drain() || drain);
  if (drain) r.set_drain_grace_ms(drain_grace_ms);
  if (r.state() != v1::NODE_DEAD) r.set_state(v1::NODE_CORDONED);
  return plan;
}

bool NodeManager::Draining(const std::string& name) const {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return false;
  const Node& node = it->second;
  if (node.draining) return true;
  return node.record.drain() && node.record.state() != v1::NODE_DEAD &&
         std::any_of(node.trainers.begin(), node.trainers.end(), IsLive);
}

bool NodeManager::ApplyPlan(const NodePlan& plan) {
  auto it = nodes_.find(plan.before.name());
  if (it == nodes_.end() || !Unchanged(it->second.record, plan.before)) return false;
  const int64_t heartbeat = it->second.record.last_heartbeat_ms();
  it->second.record = plan.after;
  it->second.record.set_last_heartbeat_ms(heartbeat);
  return true;
}

void NodeManager::CountFailure(Node& node) {
  node.record.set_failures(node.record.failures() + 1);
  node.record.set_last_failure_ms(clock_->WallNowMs());
  next_cordon_check_ms_ = std::min(next_cordon_check_ms_, ForgetNodeFailuresAt(node.record));
}

int64_t NodeManager::ForgetNodeFailuresAt(const v1::NodeRecord& r) const {
  if (options_.failure_memory_ms <= 0 || r.failures() == 0) return INT64_MAX;
  // Never while a cordon its failures earned lasts (a memory shorter than the cordon).
  return std::max(SaturatingAdd(r.last_failure_ms(), options_.failure_memory_ms),
                  r.cordon_until_ms());
}

int64_t NodeManager::ForgetSlotFaultAt(const v1::SlotFault& f) const {
  // An operator's cordon lasts until an operator ends it, and the entry holds it.
  if (options_.slot_failure_memory_ms <= 0 || !f.operator_cordon().empty()) return INT64_MAX;
  return std::max(SaturatingAdd(f.failed_ms(), options_.slot_failure_memory_ms),
                  f.cordon_until_ms());
}

bool NodeManager::Cordon(Node& node) {
  const int64_t now = clock_->WallNowMs();
  if (!MayCordon(node, now)) return false;
  const int over = node.record.failures() - options_.cordon_after_failures;
  const int64_t ms = DoublingDelayMs(over, options_.cordon_base_ms, options_.cordon_max_ms);
  node.record.set_cordon_until_ms(now + ms);
  next_cordon_check_ms_ = std::min(next_cordon_check_ms_, node.record.cordon_until_ms());
  return true;
}

bool NodeManager::MayCordon(const Node& node, int64_t now_ms) const {
  const int64_t cap = std::max<int64_t>(
      1, static_cast<int64_t>(options_.max_cordoned_share * static_cast<double>(nodes_.size())));
  int64_t cordoned = 0;
  for (const auto& [name, other] : nodes_) {
    if (&other == &node || other.record.cordon_until_ms() <= now_ms) continue;
    if (++cordoned >= cap) return false;
  }
  return true;
}

std::vector<v1::NodeRecord> NodeManager::ExpireCordons() {
  std::vector<v1::NodeRecord> changed;
  const int64_t now = clock_->WallNowMs();
  if (now < next_cordon_check_ms_) return changed;
  next_cordon_check_ms_ = INT64_MAX;
  // True when wall time `at_ms` (> 0) has come; else remembers it as a next check.
  auto due = [&](int64_t at_ms) {
    if (at_ms > now) next_cordon_check_ms_ = std::min(next_cordon_check_ms_, at_ms);
    return at_ms > 0 && at_ms <= now;
  };
  for (auto& [name, node] : nodes_) {
    v1::NodeRecord& r = node.record;
    bool ended = false;
    if (due(r.cordon_until_ms()) && r.state() == v1::NODE_CORDONED) {
      r.set_cordon_until_ms(0);
      r.set_state(LiveState(r, now));  // an operator's cordon outlasts it
      ended = true;
    }
    if (due(ForgetNodeFailuresAt(r))) {
      r.set_failures(0);
      r.set_last_failure_ms(0);
      ended = true;
    }
    auto* faults = r.mutable_slot_faults();
    for (int i = faults->size() - 1; i >= 0; --i) {
      v1::SlotFault& f = *faults->Mutable(i);
      if (due(f.cordon_until_ms())) {
        f.set_cordon_until_ms(0);  // its failures stay: the next cordon is longer
        ended = true;
      }
      if (due(ForgetSlotFaultAt(f))) {
        faults->DeleteSubrange(i, 1);
        ended = true;
      }
    }
    if (ended) changed.push_back(r);
  }
  return changed;
}

bool NodeManager::Schedulable(const std::string& name) const {
  auto it = nodes_.find(name);
  return it != nodes_.end() && IsSchedulable(it->second, clock_->WallNowMs());
}

const v1::NodeRecord* NodeManager::Find(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second.record;
}

const std::vector<v1::TrainerStatus>* NodeManager::Trainers(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second.trainers;
}

const std::vector<v1::GpuTelemetry>* NodeManager::Gpus(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second.gpus;
}

void NodeManager::ForEach(
    const std::function<void(const std::string&, const v1::NodeRecord&, bool)>& fn) const {
  const int64_t now = clock_->WallNowMs();
  for (const auto& [name, node] : nodes_) {
    fn(name, node.record, IsSchedulable(node, now));
  }
}

int64_t NodeManager::TotalSlotsEver(v1::DeviceKind device) const {
  int64_t total = 0;
  for (const auto& [name, node] : nodes_) {
    for (const auto& s : node.record.slots()) total += s.device() == device ? 1 : 0;
  }
  return total;
}

}  // namespace drover::coordinator
