// Coordinator: the state of one drover cluster and the handlers of every RPC, without the
// transport (coordinator/server.h puts gRPC in front of it).
//
// It owns the managers, declared below in dependency order, and wires them together:
// heartbeats feed NodeManager, HealthManager and JobManager; Tick() turns expired leases
// and hangs into failures and runs the scheduler; state changes go through the StoreWriter
// to SQLite, off the state lock.
//
// Memory and disk never disagree (store/store_writer.h). SubmitJob and CancelJob are made
// in memory only once durable, and are refused with the store's error otherwise. Every
// other change (heartbeats, exits, deaths, placements) cannot be refused: it is made in
// memory and then written, and if that write fails the coordinator stops (fail-stop:
// `fatal`, by default a log line naming the state dir and exit(1)), because a restart from
// disk is then the only consistent state.
//
// Thread-safe: any RPC thread may call any method. One mutex (mu_) guards the in-memory
// cluster state; it is never held across disk or network I/O (the store writer, the log
// store and rendezvous waits all run outside it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "coordinator/backoff.h"
#include "coordinator/checkpoint_registry.h"
#include "coordinator/health_manager.h"
#include "coordinator/job_manager.h"
#include "coordinator/limits.h"
#include "coordinator/log_store.h"
#include "coordinator/node_manager.h"
#include "coordinator/progress_history.h"
#include "coordinator/rendezvous.h"
#include "coordinator/store/store.h"
#include "coordinator/store/store_writer.h"
#include "proto/drover.pb.h"

namespace drover::coordinator {

struct CoordinatorOptions {
  std::string state_dir;                 // state.db and logs/ live here
  int64_t heartbeat_interval_ms = 1000;  // told to agents at registration
  int64_t heartbeat_timeout_ms = 3000;   // a node is dead after this without a heartbeat
  int64_t stop_grace_ms = 5000;          // SIGTERM -> SIGKILL grace in stop orders
  // After an agent's Watch connection closes, how long it has to heartbeat before its node
  // is dead. A live agent heartbeats at once when its connection breaks; a dead one never
  // does, so an agent process that dies is noticed in this time instead of the timeout.
  int64_t connection_grace_ms = 500;
  NodeManagerOptions nodes;
  RestartBackoff restart_backoff;
  // A finished job is deleted from the state (record, attempts, checkpoint records, logs)
  // this long after it finished; 0 keeps every job until `drover rm`. Wall clock.
  int64_t job_retention_ms = 0;
  // Jobs one submitter may have PENDING at once (0: no limit); a submit past it is
  // refused with RESOURCE_EXHAUSTED.
  int max_pending_per_submitter = kDefaultMaxPendingPerSubmitter;
};

// What tests replace; production leaves both empty.
struct CoordinatorDeps {
  std::unique_ptr<Store> store;  // null: SQLite at <state_dir>/state.db
  // Called once, on the store writer's thread, when a change already made in memory could
  // not be written. Null: log why (naming the state dir) and exit(1) at once.
  StoreWriter::FatalFn fatal;
};

class Coordinator {
 public:
  // Opens (or creates) the state dir and restores everything in it. Restored nodes get a
  // fresh heartbeat-timeout grace period, so a coordinator restart kills nothing.
  static StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorOptions& options,
                                                     const Clock* clock, CoordinatorDeps deps = {});
  ~Coordinator();

  // The address trainers dial for rendezvous, once the server knows its port.
  void SetAdvertisedAddress(const std::string& address);

  // WorkerService.
  StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  v1::HeartbeatResponse Heartbeat(const v1::HeartbeatRequest& request);
  Status ReportTrainerExit(const v1::TrainerExitRequest& request);
  Status AppendLogs(const v1::AppendLogsRequest& request);
  // An agent's Watch stream opened: FailedPrecondition unless that agent is registered.
  Status WatchOpened(const v1::WatchRequest& request);
  // It closed: the node is dead after connection_grace_ms unless its agent heartbeats.
  void WatchClosed(const v1::WatchRequest& request);
  // How the coordinator tells a node's agent that orders wait for it (through its Watch
  // stream). Called under the state lock: it must not block or call back. Set before
  // serving.
  void SetNudge(std::function<void(const std::string& node)> nudge);

  // JobService. Submit, Cancel and Delete answer only once the change is durable; one the
  // store refuses is refused with its error and changes nothing.
  //
  // A submit whose request_id names a job already accepted returns that job's id and makes
  // nothing (a client's retry); one whose first try is still being written is refused
  // with UNAVAILABLE, so the client retries and then finds it.
  StatusOr<std::string> SubmitJob(const v1::SubmitJobRequest& request);
  StatusOr<v1::JobInfo> GetJob(const std::string& job_id);
  v1::ListJobsResponse ListJobs(const v1::ListJobsRequest& request = {});
  StatusOr<v1::JobState> CancelJob(const std::string& job_id);
  // Asks a running job for a checkpoint now (JobManager::RequestCheckpoint); the step its
  // ranks had reported, which the checkpoint will be later than.
  StatusOr<int64_t> CheckpointJob(const std::string& job_id);
  // drover suspend and resume (SuspendJobRequest, ResumeJobRequest): written first and made
  // in memory once durable, as a cancel.
  StatusOr<v1::SuspendJobResponse> SuspendJob(const v1::SuspendJobRequest& request);
  StatusOr<v1::JobState> ResumeJob(const std::string& job_id);
  // drover priority (SetPriorityRequest), written and applied as a suspension.
  StatusOr<v1::SetPriorityResponse> SetPriority(const std::string& job_id, int priority);
  // drover time-limit (SetTimeLimitRequest), written and applied as a suspension.
  StatusOr<v1::SetTimeLimitResponse> SetTimeLimit(const std::string& job_id, double minutes);
  // Deletes a finished job from the state, its logs included (not its output_dir).
  // FAILED_PRECONDITION for a job that has not finished: cancel it first.
  Status DeleteJob(const std::string& job_id);
  v1::ListWorkersResponse ListWorkers(const v1::ListWorkersRequest& request = {});
  StatusOr<v1::ReadLogsResponse> ReadLogs(const v1::ReadLogsRequest& request);
  // An operator puts a node, or one slot of it, back in service (NodeManager::PlanUncordon):
  // written first, made once durable, as a cancel.
  StatusOr<v1::UncordonResponse> Uncordon(const v1::UncordonRequest& request);
  // An operator takes a node out of service until Uncordon (NodeManager::PlanCordon), and
  // with request.drain moves its trainers off: every heartbeat reply of its agent that lists
  // one live carries a DrainTrainersOrder, and their jobs restart elsewhere from the
  // checkpoint the drain saves (JobManager: kExitDrained). Written first, made once durable.
  StatusOr<v1::CordonResponse> Cordon(const v1::CordonRequest& request);

  // For the dashboard and /metrics (coordinator/http_server.h).
  std::map<v1::JobState, int64_t> CountJobsByState() const;
  // Rank 0's progress of the job's attempts as heartbeats brought it (progress_history.h).
  ProgressHistory::Series JobHistory(const std::string& job_id) const {
    return history_.Get(job_id);
  }
  int64_t WallNowMs() const { return clock_->WallNowMs(); }

  // RendezvousService: thread-safe on its own.
  RendezvousStore& rendezvous() { return rendezvous_; }

  // Expires heartbeat leases and hangs, ends cordons, places pending jobs, and deletes
  // finished jobs past their retention. Called by the server's ticker thread (and by
  // tests, after advancing a FakeClock).
  void Tick();

  // Blocks until every state change so far is in SQLite (for tests and shutdown); the
  // write error that stopped the store writer, if one did.
  Status Flush();

 private:
  Coordinator(const CoordinatorOptions& options, const Clock* clock, std::unique_ptr<Store> store,
              StoreWriter::FatalFn fatal);
  Status Restore(const StoreContents& contents);
  // Queues a change already made in memory (fail-stop if it cannot be written).
  void Persist(StoreBatch batch) REQUIRES(mu_);
  // Cordons a node a job's ranks found cut off from their peers (JobManager's hook).
  void CordonCutOff(const std::string& node, const std::string& why) REQUIRES(mu_);
  // Says why node `node`, which has failed `failures` times (`why` the last), was left in
  // use: NodeManagerOptions::max_cordoned_share.
  void WarnCordonHeldBack(const std::string& node, const std::string& why, int failures) const;
  // Cordons one slot of a node whose device failed under a trainer, or (`slow`) whose rank
  // was moved off or dropped as a straggler (JobManager's hooks).
  void CordonSlot(const std::string& node, int slot, const std::string& why, bool slow = false)
      REQUIRES(mu_);
  // Calls `free` for each slot of node `name` (record `rec`) a new rank could take at wall
  // time now_ms, until it returns false: in use (neither cordoned nor unfit: SlotOut) and
  // held by no rank of a running attempt nor by a trainer its agent still lists. Slots held
  // only by listed trainers (of ended attempts, stopping) go to `releasing`, when given.
  void ForEachFreeSlot(const std::string& name, const v1::NodeRecord& rec, int64_t now_ms,
                       const std::function<bool(const v1::Slot&)>& free,
                       const std::function<void(const v1::Slot&)>& releasing = nullptr) const
      REQUIRES(mu_);
  // Whether a slot of `device`'s kind is free on a schedulable node (ForEachFreeSlot):
  // JobManager::CheckStragglers' spare.
  bool HasFreeSlot(v1::DeviceKind device) const REQUIRES(mu_);
  // What `node`'s agent reports of its GPUs (NodeManager::TakeHealth): a slot reported unfit
  // for the first time is cordoned (CordonSlot) and the attempt running on it fails
  // (JobManager::OnSlotFailed); one no longer reported may be scheduled again.
  void TakeSlotHealth(const std::string& node,
                      const google::protobuf::RepeatedPtrField<v1::SlotHealth>& unhealthy)
      REQUIRES(mu_);
  // A RUNNING job's notices (JobInfo.notices), from `info`'s trainers and the agents' last
  // GPU readings: a rank on a slowed GPU, a rank its stage waits for (straggler.h).
  void AddNotices(const v1::JobRecord& rec, v1::JobInfo* info) const REQUIRES(mu_);
  // An operator's change to a node (Cordon, Uncordon): `plan_change` works it out under the
  // state lock, it is written, and made once durable, then `applied` runs under the lock;
  // planned again when the node changed meanwhile. `what` says what was not done, for errors.
  Status ChangeNode(const std::string& what,
                    const std::function<StatusOr<NodeManager::NodePlan>()>& plan_change,
                    const std::function<void(const NodeManager::NodePlan&)>& applied) EXCLUDES(mu_);
  // Writes and applies the plan `plan_change` makes of a job (SuspendJob, ResumeJob,
  // SetPriority) and returns it as applied,
  // planning again when the job moved on under the write; `what` says what was not done.
  StatusOr<JobManager::JobPlan> ChangeJob(
      const std::string& what, const std::function<StatusOr<JobManager::JobPlan>()>& plan_change)
      EXCLUDES(mu_);
  // Queues a change not made yet; the caller waits with writer_->WaitProposal.
  int64_t Propose(StoreBatch batch) REQUIRES(mu_);
  // `error`, from a refused proposal, as the answer to the client: what was not done, where.
  Status Refused(const std::string& what, const Status& error) const;
  void ObserveTrainers(const std::string& node) REQUIRES(mu_);
  // A DrainTrainersOrder for `node` while an operator drains it and its agent lists a live
  // trainer (the agent signals none twice, so repeating it costs nothing).
  void AppendDrainOrder(const std::string& node,
                        google::protobuf::RepeatedPtrField<v1::Order>* orders) const REQUIRES(mu_);
  std::vector<int> BusySlots(const std::string& node) const REQUIRES(mu_);
  // Appends the slots of live trainers the node's agent lists (a stopped attempt's
  // survivor keeps its slot until it exits).
  void AppendListedSlots(const std::string& node, std::vector<int>* slots) const REQUIRES(mu_);
  // For each of `pending`'s regrouping jobs, its held_slots: slots that trainers of its
  // ended attempts still hold on schedulable nodes, slots in use (SlotOut), at wall time
  // now_ms.
  void CountHeldSlots(std::vector<PendingJob>* pending, int64_t now_ms) const REQUIRES(mu_);
  void ScheduleLocked() REQUIRES(mu_);
  void TickLocked() REQUIRES(mu_);  // everything Tick does but retention
  // Forgets finished jobs past options_.job_retention_ms and queues their deletion;
  // returns their ids, whose logs the caller deletes off the lock.
  std::vector<std::string> ExpireJobsLocked() REQUIRES(mu_);
  // Why `request` may not be submitted now (per-submitter limit), or OK.
  Status CheckSubmitter(const v1::SubmitJobRequest& request) const REQUIRES(mu_);
  // Nudges the agents of the job's current placement.
  void NudgeNodesOf(const std::string& job_id) REQUIRES(mu_);
  // The store writer made every change up to `seq` durable: the attempts started by then
  // may be started by their agents now.
  void OnDurable(int64_t seq);

  const Clock* const clock_;
  const CoordinatorOptions options_;
  // Dependency order: the store and its writer first; the managers that persist through
  // them after; the registry of checkpoints before the job manager that resumes from it.
  std::unique_ptr<Store> store_;
  std::unique_ptr<StoreWriter> writer_;
  LogStore logs_;
  RendezvousStore rendezvous_;
  ProgressHistory history_;  // thread-safe on its own

  mutable Mutex mu_;
  std::function<void(const std::string& node)> nudge_ GUARDED_BY(mu_);
  NodeManager nodes_ GUARDED_BY(mu_);
  HealthManager health_ GUARDED_BY(mu_);
  CheckpointRegistry checkpoints_ GUARDED_BY(mu_);
  JobManager jobs_ GUARDED_BY(mu_);
  int64_t next_submit_seq_ GUARDED_BY(mu_) = 1;
  uint32_t id_salt_ GUARDED_BY(mu_) = 0;
  int64_t last_write_seq_ GUARDED_BY(mu_) = 0;  // the newest batch queued
  // Attempts placed but not yet durable (job -> the write that records them): no start
  // order leaves for them before it is on disk, so a coordinator that crashes meanwhile
  // never meets trainers of an attempt it does not know, nor gives its number to another.
  std::map<std::string, int64_t> undurable_attempts_ GUARDED_BY(mu_);
  // A scheduling pass walks every node, so Tick runs one only when something that can
  // change its outcome happened (a job submitted, cancelled or ended, a node registered,
  // revived, died or left its cordon, a trainer exited), plus once per
  // kScheduleFallbackMs for changes no event announces (a survivor vanishing from a
  // listing). A 10,000-node cluster with a queue would otherwise pay for a pass per tick.
  bool schedule_due_ GUARDED_BY(mu_) = true;
  int64_t last_schedule_ms_ GUARDED_BY(mu_) = 0;
  static constexpr int64_t kScheduleFallbackMs = 1000;
  // Submits proposed but not yet durable, by request id and by submitter: a retry of one
  // must not make a second job, and the pending limit counts them.
  std::set<std::string> submitting_request_ids_ GUARDED_BY(mu_);
  std::map<std::string, int> submitting_of_ GUARDED_BY(mu_);
  // Retention walks every job: once per kExpiryCheckMs (monotonic), or at once while the
  // last walk found more than it deletes in one go.
  int64_t next_expiry_check_ms_ GUARDED_BY(mu_) = 0;
  static constexpr int64_t kExpiryCheckMs = 60'000;
  static constexpr size_t kMaxExpiredPerTick = 1000;
};

}  // namespace drover::coordinator
