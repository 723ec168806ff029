// NodeManager: the registry of worker nodes, their slots, what each agent last said it runs,
// and cordoning of nodes that fail repeatedly.
//
// Not thread-safe: the coordinator calls it under its state lock. It never touches disk;
// methods that change a persisted field return the NodeRecord for the caller to store.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/node_slots.h"
#include "common/status.h"
#include "proto/drover.pb.h"

namespace drover::coordinator {

struct NodeManagerOptions {
  // Node failures (deaths) before the node is cordoned; every further failure cordons it
  // again for twice as long as the previous time, up to cordon_max_ms.
  int cordon_after_failures = 2;
  int64_t cordon_base_ms = 30'000;
  int64_t cordon_max_ms = 600'000;
  // A slot whose GPU failed is cordoned at its first failure, for slot_cordon_base_ms,
  // doubled by each earlier failure of that slot up to slot_cordon_max_ms. Longer than a
  // node's: a GPU that reported an uncorrectable error usually needs a reset or a repair,
  // and each return to use costs the job that grows onto it a restart.
  int64_t slot_cordon_base_ms = 300'000;
  int64_t slot_cordon_max_ms = 86'400'000;
  // A node that has gone this long since its last failure, with no cordon left, has its
  // failures forgotten (its next death counts as its first), as a slot has after
  // slot_failure_memory_ms. Without it, every node of a long-lived cluster would collect
  // failures over the months until one death in a quiet month cordoned it for the longest
  // cool-down. Longer than the longest cordon, so that a node failing again as soon as it
  // returns is still counted as repeating. 0: never forget (only drover uncordon does).
  int64_t failure_memory_ms = 3'600'000;
  int64_t slot_failure_memory_ms = 7 * 86'400'000LL;
  // At most max(1, floor(max_cordoned_share x nodes known)) nodes are cordoned for their
  // failures at once; a failure that would cordon one more is counted, and the node stays
  // in use. Many nodes failing together points at what they share (the network, a switch,
  // the coordinator itself) more than at the nodes, and cordoning them all would leave
  // nothing to run on once that is mended: Kubernetes' node controller slows its evictions
  // in an unhealthy zone for the same reason. A node failing on its own, the case cordons
  // are for, is always cordoned (the cap is at least one node); a job whose restarts meet
  // an uncordoned node is paced by its restart back-off. Slot cordons (a GPU's own fault)
  // are not capped. 1: no cap.
  double max_cordoned_share = 0.5;
};

class NodeManager {
 public:
  NodeManager(const Clock* clock, NodeManagerOptions options);

  // Loads a persisted node after a coordinator restart. It is not schedulable until its
  // agent heartbeats again (`connected` false), whatever state it had.
  void Restore(const v1::NodeRecord& record);

  // Why `request` may not take its name, or "" when it may: the name belongs to a node that
  // is not dead and whose agent is another node (another node_uid; a restarted agent of the
  // same node keeps its uid and is welcome). A node that died may be taken over.
  std::string RegistrationConflict(const v1::RegisterRequest& request) const;

  // Registers (or re-registers) a node: new agent id, address, slots, and what it runs.
  // Keeps failures and cordoning. Returns the record to persist. Check
  // RegistrationConflict first.
  v1::NodeRecord Register(const v1::RegisterRequest& request);

  // True when `name` is known and `agent_id` is its current agent.
  bool Accepts(const std::string& name, const std::string& agent_id) const;

  // True for a Register or Heartbeat of `agent_id` on `name` that its agent sent before one
  // this manager has already taken (HeartbeatRequest.seq): it arrived late, and what it
  // lists is older than what is known. A request of another agent, or without a seq, is
  // never stale.
  bool Stale(const std::string& name, const std::string& agent_id, int64_t seq) const;

  // Records a heartbeat from an accepted node: its trainer list replaces the last one.
  // Returns the record to persist when the node changed state (a dead node came back).
  std::optional<v1::NodeRecord> OnHeartbeat(const v1::HeartbeatRequest& request);

  // Updates one trainer in the node's listing (an exit reported between heartbeats).
  void UpdateTrainer(const std::string& name, const v1::TrainerStatus& trainer);

  // Marks the node dead and counts a failure against it (cordoning it when due, unless
  // max_cordoned_share holds the cordon back: then *held_back, when given, is set true); a
  // node whose agent was draining (stopped on purpose) is marked dead without one.
  // Returns the record to persist, or nullopt when the node is unknown or already dead.
  std::optional<v1::NodeRecord> MarkDead(const std::string& name, bool* held_back = nullptr);

  // A node that is alive but that its peers cannot reach (a job's ranks found it cut off):
  // counts a failure against it and cordons it at once, for the cool-down its failures
  // have earned (at least cordon_base_ms), unless max_cordoned_share holds the cordon back
  // (*held_back, when given, is set true; the node stays in use). Returns the record to
  // persist, or nullopt when the node is unknown or dead.
  std::optional<v1::NodeRecord> CordonCutOff(const std::string& name, bool* held_back = nullptr);

  // A slot whose device failed under a trainer (the trainer exited with kExitDeviceFault),
  // or, `slow`, whose rank was a straggler moved off it: counts a failure against that slot
  // (SlotFault.slow too, when slow) and cordons it alone, at once, for the cool-down its
  // failures have earned (slot_cordon_*); the node's other slots stay in use. `why` is kept
  // for `drover workers`. Returns the record to persist, or nullopt when the node is unknown
  // or has no such slot.
  std::optional<v1::NodeRecord> CordonSlot(const std::string& name, int slot,
                                           const std::string& why, bool slow = false);

  // What the node's agent reports of its GPUs' health (Register or Heartbeat): the slots
  // whose GPU its check finds unfit replace those it reported before, and stay out of use
  // (drover::SlotOut) until it no longer reports them. Returns the slots it reports that it
  // did not report last time (each one's first report: the caller cordons it, CordonSlot);
  // `changed`, when given, says whether the list changed at all. Entries naming a slot the
  // node does not have are dropped, and so are latches an operator cleared
  // (cleared_latches): the agent, not told yet, still reports them. A cleared latch the agent
  // no longer reports is forgotten.
  std::vector<v1::SlotHealth> TakeHealth(
      const std::string& name, const google::protobuf::RepeatedPtrField<v1::SlotHealth>& unhealthy,
      bool* changed = nullptr);

  // An operator's change to a node, worked out but not made: the caller makes `after`
  // durable, then ApplyPlan()s it.
  struct NodePlan {
    v1::NodeRecord before;  // as it was planned from
    v1::NodeRecord after;
    bool was_cordoned = false;  // a cordon was in force (PlanUncordon: and ended)
  };
  // An operator's uncordon: node `name` with its cordon ended (its operator cordon and drain
  // too) and its failures forgotten, with every slot's too (`slot` < 0), or only that slot's.
  // NotFound for an unknown node or slot; FailedPrecondition for a slot its agent reports
  // unfit (it returns by itself once the agent no longer does: its cordon would not end
  // anything), unless the finding is a latch (a critical Xid), which only an operator ends:
  // the plan clears it (cleared_latches, for the agent; the slot in use at once), as every
  // latch of the node when `slot` < 0.
  StatusOr<NodePlan> PlanUncordon(const std::string& name, int slot) const;
  // An operator's cordon (drover cordon; `drain`: drover drain): node `name` out of service
  // until PlanUncordon, `why` (who and why) kept for drover workers; with `slot` >= 0 only
  // that slot (SlotFault.operator_cordon; a slot's drain is JobManager::PlanSlotDrain's, so
  // `drain` changes nothing then). A node's drain stays once asked, with the grace
  // (`drain_grace_ms`, 0: the agent's own) of the latest one; a repeated cordon keeps the
  // first one's time. NotFound for an unknown node or slot.
  StatusOr<NodePlan> PlanCordon(const std::string& name, bool drain, const std::string& why,
                                int slot = -1, int drain_grace_ms = 0) const;
  // Makes a planned change; false, changing nothing, when the node's record changed since
  // it was planned (another failure, a re-registration: plan again).
  bool ApplyPlan(const NodePlan& plan);

  // Whether the node's trainers are leaving with their jobs' checkpoints: its agent is
  // stopping, or an operator drains it and its agent lists one live. False for an unknown node.
  bool Draining(const std::string& name) const;

  // Returns the nodes whose cool-down, or one of whose slots' cool-down, has passed, and
  // those whose failures have passed their memory (to persist): a cordoned node is ALIVE
  // again, a cordoned slot usable again; a node's failure count is 0 again, a slot's fault
  // entry is gone.
  std::vector<v1::NodeRecord> ExpireCordons();

  // Alive, connected, not draining (its agent stopping) and not cordoned (for its failures or
  // by an operator).
  bool Schedulable(const std::string& name) const;

  const v1::NodeRecord* Find(const std::string& name) const;
  // Trainers the node's agent listed last (live or just exited).
  const std::vector<v1::TrainerStatus>* Trainers(const std::string& name) const;
  // What the node's agent read of its GPUs in its last heartbeat (none from an agent that
  // checks none); nullptr for an unknown node.
  const std::vector<v1::GpuTelemetry>* Gpus(const std::string& name) const;

  // Calls fn(name, record, schedulable) for every node, ordered by name, without copying.
  void ForEach(
      const std::function<void(const std::string&, const v1::NodeRecord&, bool)>& fn) const;

  // Slots of every node ever registered, per device: what the cluster could ever offer.
  int64_t TotalSlotsEver(v1::DeviceKind device) const;

 private:
  struct Node {
    v1::NodeRecord record;
    bool connected = false;  // heartbeating since this coordinator started
    std::vector<v1::TrainerStatus> trainers;
    std::vector<v1::GpuTelemetry> gpus;  // memory only: a reading is stale in seconds
    int64_t seq = 0;        // of the newest Register or Heartbeat taken from record.agent_id()
    bool draining = false;  // its agent is stopping (HeartbeatRequest.draining)
  };
  // Counts one failure against the node, now.
  void CountFailure(Node& node);
  // Cordons the node for the cool-down its failures have earned; false, changing nothing,
  // when max_cordoned_share allows no further node to be cordoned.
  bool Cordon(Node& node);
  // Whether `node` may be cordoned now: fewer nodes than the cap are, `node` not counted
  // (a longer cordon for one already cordoned adds none). Walks every node: called only
  // for a node's repeated failure, never per heartbeat or tick.
  bool MayCordon(const Node& node, int64_t now_ms) const;
  // Wall time at which the node's failures, or a slot's fault entry, are forgotten, or
  // INT64_MAX when never (nothing to forget, or no memory limit).
  int64_t ForgetNodeFailuresAt(const v1::NodeRecord& r) const;
  int64_t ForgetSlotFaultAt(const v1::SlotFault& f) const;
  // Alive, connected, not draining and not cordoned (for failures or by an operator) at wall
  // time `now_ms`.
  static bool IsSchedulable(const Node& node, int64_t now_ms) {
    const v1::NodeRecord& r = node.record;
    return node.connected && !node.draining && r.state() == v1::NODE_ALIVE &&
           r.cordon_until_ms() <= now_ms && r.operator_cordon().empty();
  }

  const Clock* const clock_;
  const NodeManagerOptions options_;
  std::map<std::string, Node> nodes_;
  // No cordon ends and no failure is forgotten before this (wall ms): ExpireCordons, called
  // every tick, walks the nodes only from then on, not ten times a second over a
  // 10,000-node cluster.
  int64_t next_cordon_check_ms_ = INT64_MAX;
};

}  // namespace drover::coordinator
