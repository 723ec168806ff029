// JobManager: every job's life cycle, its attempts, and the orders that follow from them.
//
//   PENDING -> RUNNING -> (RECOVERING -> RUNNING)* -> SUCCEEDED | FAILED | CANCELLED
//   (and, by drover suspend and resume, PENDING | RECOVERING | RUNNING -> SUSPENDED -> PENDING)
//
// An attempt is one placement of a job; its number only grows. Anything that names an
// attempt other than the job's current RUNNING one is ignored (fencing). On any failure of
// an attempt (a rank exited non-zero or by a signal, hung, vanished, or its node died) the
// attempt ends at once: every surviving trainer of it gets a StopTrainersOrder in its
// agent's next heartbeat reply, and the job is RECOVERING (a restart, counted against
// max_restarts) or FAILED when none is left. The scheduler then places the next attempt,
// which resumes from the newest complete checkpoint. SUCCEEDED when every rank of the
// current attempt exited 0.
//
// Restarts back off (backoff.h): the first restart after a failure is placed at once, and a
// job whose attempts keep failing waits longer each time (JobRecord.restart_not_before_ms,
// and its reason says so). The next placement also prefers nodes other than those where its
// failing attempts failed, when its gang fits there (PendingJob::avoid_nodes). Nodes that
// die repeatedly are NodeManager's concern (a cordon for the whole cluster); a rank that
// fails says nothing certain about its node, so it only steers this job.
//
// Growing back: a RUNNING job below its largest feasible world size is offered the slots
// left free by a scheduling pass (PlanGrowth, refreshed by every pass). It keeps training
// at its size until its next complete checkpoint, which it is asked to save at once (see
// "Checkpoints on demand"); then that attempt ends ("resized", not a failure: no restart
// counted, no back-off) and the next one resumes from that checkpoint at the larger size.
// What a resize costs is the steps between the checkpoint and the stop, not an interval:
// it happens at the checkpoint's report. For a short while
// (the stop grace period plus a second) the next attempt is placed only at the planned
// size, so that it waits for its old ranks' slots instead of starting small on the new
// ones alone; after that it takes what fits, as after a failure.
//
// Preemption works the same way (PlanPreemption): a RUNNING job of lower priority than the
// job blocking its device's queue is planned to shrink, or to yield every slot, at its next
// complete checkpoint. Shrunk, it resumes at the smaller size as after growing; yielding,
// it goes back to the queue (RECOVERING, no restart counted, its reason naming the job it
// made room for) and resumes from that checkpoint when slots are free again. A job that
// saves no checkpoints is never preempted: it would lose everything it trained.
//
// Suspension (PlanSuspend, PlanResume: job_manager_changes.cc): an operator stops a job
// on purpose and places it again later. One waiting for slots is SUSPENDED at once. A
// RUNNING one that saves checkpoints is asked for one now (JobRecord.suspend, persisted, so
// a coordinator restart asks again) and becomes SUSPENDED at its report, as a preempted job
// yields: its attempt ends ("suspended by ..."), its trainers are stopped, no restart is
// counted. Its plans to resize or replace stragglers are dropped; an attempt that fails
// meanwhile is not restarted but suspended. Asked to suspend `now`, a RUNNING job stops at
// once, without a new checkpoint (one whose training went wrong: the newest checkpoint is
// the one to keep); one that saves no checkpoints only so (it starts again from step 0),
// and `now` hurries one that waits for its checkpoint. A SUSPENDED job is
// never placed; drover resume makes it PENDING, and its next attempt resumes from its newest
// complete checkpoint. Resuming a RUNNING job asked to suspend withdraws the request.
//
// Checkpoints on demand (RequestCheckpoint; PlanResize makes one with each new plan): while
// a request is pending, the agents of the job's ranks get a CheckpointTrainersOrder in every
// heartbeat reply, and send each trainer SIGUSR1 once per request id; the ranks agree on
// the step through their step's all-reduce (worker/engine/trainer.h). The request ends with
// a complete checkpoint of a later step than the ranks had reported, or with the attempt.
// In memory only: a coordinator restart forgets it (a resize plan is made again by the
// first scheduling pass, and asks again).
//
// Stragglers (fault_tolerance.replace_stragglers_after_s > 0; CheckStragglers): a rank the
// others of its pipeline stage have waited for (straggler.h) in every check for that long
// is moved at the job's next checkpoint, asked for at once, as a resize is: its slot is
// cordoned for every job (hooks.slot_straggling; its node's other slots stay in use), the
// attempt ends ("replacing straggler rank R ..."; no restart counted, no back-off) and the
// next one resumes from that checkpoint on a free slot. Without a free slot of the job's
// device kind, an elastic job drops its stragglers instead (every rank found straggling,
// each for that long), when by the paces it had without stragglers it would step sooner at
// the largest feasible world size that leaves them out (ShrinkWithout, straggler.h): the
// same, but "dropping straggler rank R ..., shrinking from N to M ranks", and the next
// attempt takes M. It grows back when slots come free, the dropped ones at the end of their
// cordon (a slot still slow is then dropped again, for a longer cordon). A job that cannot
// shrink, or for which it does not pay, keeps its stragglers. In memory only, like
// checkpoint requests, and the paces too.
//
// Jobs that run after others (JobRecord.after, drover submit --after): a job is left out
// of the scheduler's queue (Pending) until each job it names has SUCCEEDED, its reason
// naming those it waits for, so that it holds back no job behind it. Once every one has,
// it takes its place by priority and submit order. One whose predecessor ended otherwise,
// or was deleted, can never start: it stays PENDING and says so, until cancelled.
//
// Time limits (resources.time_limit_minutes; CheckTimeLimits, job_manager_time_limit.cc): a
// job may run that long, counted over its attempts, each from its placement to its end
// (waiting, recovering and suspended, it uses none). Once a RUNNING job has run for its
// limit, one that saves checkpoints is asked for one at once, its plans to resize or move
// stragglers dropped, and at its report the attempt ends and the job is FAILED, its reason
// saying so and naming that checkpoint: a job submitted again with the same checkpoint.dir
// goes on from it. One that saves none stops at once, as does one whose checkpoint has not
// come within its hang timeout (fault_tolerance.hang_timeout_s: a hung job's ranks would be
// found only at their own timeout, and a failing save never). An attempt that fails with the
// limit used up is not restarted, and a waiting job whose time is used up (an attempt ended
// by a resize or a move just at the limit) is FAILED without another placement. The limit is
// counted again from the stored attempts after a coordinator restart, which asks again.
// drover time-limit changes it (PlanTimeLimit) while the job has not finished, in its spec,
// so that the spec stays the one record of it; a job stopping at its old limit trains on
// when the new one is longer than it has run (its checkpoint asked for is still saved).
//
// Orders are level-triggered, computed from what an agent lists in each heartbeat: a
// start is re-sent until the agent lists that trainer; a stop is re-sent while the agent
// lists a live trainer that is not part of a current attempt (which also covers trainers
// adopted after a re-registration and leftovers of a coordinator restart).
//
// Not thread-safe: the coordinator calls it under its state lock. It never touches disk.
// Transitions it cannot refuse (driven by trainers, nodes and the scheduler) are made in
// memory and handed to hooks.persist as one StoreBatch (one transaction) each. The two
// that come from users, submit and cancel, are worked out first and made only once the
// caller has made them durable (PrepareSubmit/Add, PlanCancel/ApplyCancel), so that one
// the store refuses leaves memory as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/job_spec.h"
#include "coordinator/backoff.h"
#include "coordinator/limits.h"
#include "coordinator/scheduler.h"
#include "coordinator/store/store.h"
#include "coordinator/straggler.h"
#include "coordinator/trainer_key.h"
#include "proto/drover.pb.h"

namespace drover::coordinator {

struct JobManagerOptions {
  int64_t stop_grace_ms = 5000;     // in StopTrainersOrder: SIGTERM, then SIGKILL after this
  std::string coordinator_address;  // in StartTrainerOrder, for rendezvous
  RestartBackoff restart_backoff;   // how long a failed job waits before its next attempt
};

class JobManager {
 public:
  struct Hooks {
    std::function<void(StoreBatch)> persist;
    std::function<void(const std::string& job_id, int64_t attempt)> attempt_started;
    // Called while Find(job_id)->placement() still names the ended attempt's ranks.
    std::function<void(const std::string& job_id, int64_t attempt)> attempt_ended;
    // A node the ranks of an attempt found cut off from its peers (the trainers' peer
    // check): it is broken for every job, not this one only. May be null.
    std::function<void(const std::string& node, const std::string& why)> node_cut_off;
    // A slot whose device failed under a rank of an attempt (the trainer exited with
    // kExitDeviceFault): the GPU is broken for every job. May be null.
    std::function<void(const std::string& node, int slot, const std::string& why)> slot_failed;
    // A slot whose rank was replaced as a straggler (see above): slow for every job. May be
    // null.
    std::function<void(const std::string& node, int slot, const std::string& why)> slot_straggling;
  };
  using Orders = google::protobuf::RepeatedPtrField<v1::Order>;

  JobManager(const Clock* clock, JobManagerOptions options, Hooks hooks);

  // Loads persisted jobs and attempts after a restart. A RUNNING job's ranks are started
  // again through (idempotent) start orders until their agents list them.
  void Restore(const std::vector<v1::JobRecord>& jobs,
               const std::vector<v1::AttemptRecord>& attempts);

  // A submitted job, not added yet: the caller makes `record` durable, then Add()s it.
  struct NewJob {
    v1::JobRecord record;
    JobSpec spec;
  };
  // Builds the record of a job whose spec parses (INVALID_ARGUMENT with the parser's
  // message if not, or when it is over kMaxSpecBytes). Changes nothing.
  StatusOr<NewJob> PrepareSubmit(const std::string& spec_yaml, int priority,
                                 const std::string& job_id, int64_t submit_seq) const;
  // Adds a prepared job whose record is durable. Persists nothing.
  void Add(NewJob job);
  // The jobs a submitted job is to run after (SubmitJobRequest.after): INVALID_ARGUMENT over
  // kMaxAfterJobs, NOT_FOUND naming the first that does not exist.
  Status CheckAfter(const google::protobuf::RepeatedPtrField<std::string>& after) const;

  // Forgets a finished job whose deletion from the store was queued (drover rm, or its
  // retention expired). False when it is unknown. REQUIRES: it is not live.
  bool Remove(const std::string& job_id);
  // Finished jobs that finished at or before wall time `cutoff_ms`, oldest submitted
  // first, at most `max` of them.
  std::vector<std::string> FinishedBefore(int64_t cutoff_ms, size_t max) const;

  // A cancel worked out from the job as it is, not made yet: the caller makes `batch`
  // durable, then ApplyCancel()s it.
  struct CancelPlan {
    std::string job_id;
    int64_t version = 0;  // the job's persisted version it was worked out from
    int64_t at_ms = 0;    // wall time of the cancel
    StoreBatch batch;     // the job's record after the cancel, and the attempt it ends
  };
  // REQUIRES: the job exists and has not finished.
  CancelPlan PlanCancel(const std::string& job_id) const;
  // Makes a planned cancel in memory; persists nothing. False, changing nothing, when the
  // job's persisted state moved on since PlanCancel (a newer record of it was queued after
  // the plan's, so the plan's is not the last word on disk): plan again.
  bool ApplyCancel(const CancelPlan& plan);

  // An operator's change to a job that has not finished (drover suspend, resume, priority),
  // worked out from the job as it is (as a cancel): the caller makes `batch` durable (empty:
  // nothing changes), then ApplyJobPlan()s it, which is false, changing nothing, when the
  // job's persisted state moved on meanwhile: plan again.
  struct JobPlan {
    enum Change { kNone, kAsk, kSuspendNow, kResume, kPriority, kTimeLimit };
    std::string job_id;
    int64_t version = 0;
    Change change = kNone;
    v1::SuspendJobRequest request;  // kAsk, kSuspendNow
    int priority = 0;               // kPriority: the new one
    int previous_priority = 0;      // the job's priority when planned
    // kTimeLimit: the spec with the new limit, its text, and the job's limit and running
    // time when planned.
    JobSpec spec;
    std::string spec_yaml;
    double previous_minutes = 0;
    int64_t ran_ms = 0;
    int64_t at_ms = 0;
    StoreBatch batch;
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;  // the job's state once applied
    // Set by ApplyJobPlan: the job's checkpoint request's after_step for kAsk and for a
    // kNone of a job asked to suspend (-1 otherwise).
    int64_t after_step = -1;
  };
  // NOT_FOUND for an unknown job, FAILED_PRECONDITION for a finished one and for a RUNNING
  // one that saves no checkpoints unless request.now.
  StatusOr<JobPlan> PlanSuspend(const v1::SuspendJobRequest& request) const;
  // NOT_FOUND for an unknown job; kNone for one not suspended.
  StatusOr<JobPlan> PlanResume(const std::string& job_id) const;
  // NOT_FOUND for an unknown job, FAILED_PRECONDITION for a finished one; kNone for one of
  // that priority already. The next scheduling pass orders the queue and plans preemptions
  // by it.
  StatusOr<JobPlan> PlanPriority(const std::string& job_id, int priority) const;
  // NOT_FOUND for an unknown job, FAILED_PRECONDITION for a finished one, INVALID_ARGUMENT
  // for a limit the spec refuses; kNone for one of that limit already. See "Time limits".
  StatusOr<JobPlan> PlanTimeLimit(const std::string& job_id, double minutes) const;
  bool ApplyJobPlan(JobPlan* plan);

  // Jobs ready for a placement: PENDING, or RECOVERING once their restart delay is over.
  // A job still in its delay is left out, and its reason says for how long (refreshed by
  // each call). A job whose attempt failed within the stop grace and a second is
  // `regrouping`: the caller counts the slots its stopped trainers still hold. Each says what
  // its time limit leaves it (time_left_ms).
  std::vector<PendingJob> Pending();
  // Wall time when the next restart delay ends (INT64_MAX: none): a scheduling pass is due
  // then, whatever else happens.
  int64_t NextRestartMs() const { return next_restart_ms_; }
  // Why a pending job waits, for people (in memory: it changes on every scheduling pass).
  void SetWaitingReason(const std::string& job_id, const std::string& reason);
  // RUNNING jobs that can change size: those that save checkpoints (a resize resumes from
  // one), at whatever size they run, but for those asked to suspend or with a move planned
  // (their attempt ends at their next checkpoint anyway).
  std::vector<RunningJob> Resizable() const;
  // For Backfill: each RUNNING job with a time limit, its slots and the time its limit
  // leaves it (a job already past it, stopping at its checkpoint: 0).
  std::vector<SlotRelease> TimedReleases() const;
  // Plans what a RUNNING job becomes at its next complete checkpoint (grown, shrunk, or
  // preempted: see above), or withdraws the plan (nullopt). Shown in its reason. A new plan
  // also asks the job for a checkpoint now (RequestCheckpoint), so that it resizes within a
  // step or two instead of at its next checkpoint.every_steps; withdrawn, the request goes
  // too. True when it made a request (its nodes have orders waiting).
  bool PlanResize(const std::string& job_id, std::optional<ResizePlan> plan);
  // Asks a RUNNING job's ranks to save a checkpoint at the end of the step they are in:
  // their agents get a CheckpointTrainersOrder with every heartbeat reply until a checkpoint
  // of a step after the newest one the ranks had reported (returned) completes, or the
  // attempt ends. Idempotent while one is pending (the same step returned). NotFound for an
  // unknown job; FailedPrecondition when it is not RUNNING or saves no checkpoints.
  StatusOr<int64_t> RequestCheckpoint(const std::string& job_id, const std::string& reason);
  // Checks the RUNNING jobs that replace stragglers (see above) at wall time now_ms: plans
  // the move of a rank straggling for replace_stragglers_after_s when `spare(device)` says a
  // free slot of the job's kind exists, or else the drop of its stragglers where that pays,
  // and asks for the checkpoint it happens at. Returns the jobs it asked (their nodes have
  // orders waiting).
  std::vector<std::string> CheckStragglers(int64_t now_ms,
                                           const std::function<bool(v1::DeviceKind)>& spare);
  // Applies the time limits (see above) at wall time now_ms: asks each RUNNING job that has
  // run for its limit for its last checkpoint (their ids are returned: their nodes have
  // orders waiting), and ends the jobs whose limit says they stop now.
  std::vector<std::string> CheckTimeLimits(int64_t now_ms);
  // An operator drained slot `slot` of `node` (drover drain NODE --slot S; `why`: who and
  // why), which its cordon already keeps from new work: the RUNNING job with a live rank
  // there moves it off as a straggler is moved, not counted as a restart. At a checkpoint
  // asked for now, onto a free slot when `spare(device)` says one exists, else at the
  // largest smaller feasible size (or, with none, waiting for a slot); a job that saves no
  // checkpoints at once, starting again from step 0. A job with a move planned already (a
  // straggler's) keeps that plan: its attempt ends at that checkpoint, and its next
  // placement leaves the cordoned slot out. Returns that job's id, or "" when no job runs
  // there; *checkpoints says whether it saves checkpoints.
  std::string PlanSlotDrain(const std::string& node, int slot, const std::string& why,
                            const std::function<bool(v1::DeviceKind)>& spare, bool* checkpoints);
  // Starts the next attempt of a pending job on `placement`, resuming from `resume`
  // (nullptr: fresh start).
  void StartAttempt(const Placement& placement, const v1::CheckpointRecord* resume);

  // A trainer as its agent on `node` lists it (heartbeat, registration or exit report).
  void OnTrainerStatus(const std::string& node, const v1::TrainerStatus& trainer);
  // After a full listing from `node`: a rank that its agent had listed before and no
  // longer lists (without an exit) is lost, which fails its attempt.
  void OnListing(const std::string& node, const std::vector<v1::TrainerStatus>& listed);
  // `node` died: every current attempt with a rank there fails.
  void OnNodeLost(const std::string& node, const std::string& why);
  // A trainer's step did not move for the hang timeout.
  void OnHang(const TrainerKey& key);
  // `slot` of `node` went out of use under whatever runs there (its agent's health check
  // found its GPU unfit: `why`): the RUNNING attempt with a rank on it fails at once, its
  // restart not counted against max_restarts (as for a trainer's own kExitDeviceFault: the
  // slot's growing cool-down bounds how often a job meets that GPU again), and that rank's
  // own exit with kExitDeviceFault, which may follow, is not handed to slot_failed again.
  void OnSlotFailed(const std::string& node, int slot, const std::string& why);
  // A complete checkpoint reported by a trainer. False when fenced (older attempt). A new
  // one ends the attempt of a job planned to resize (see above).
  bool OnCheckpoint(const v1::CheckpointRecord& record);

  // Appends the orders for `node`, given what its agent lists now; start orders only for
  // jobs `may_start` accepts (null: all).
  void AppendOrders(
      const std::string& node, const std::vector<v1::TrainerStatus>& listed, Orders* orders,
      const std::function<bool(const std::string& job_id)>& may_start = nullptr) const;

  // The address trainers dial for rendezvous (known once the server is bound).
  void set_coordinator_address(std::string address) {
    options_.coordinator_address = std::move(address);
  }

  // Queries.
  const v1::JobRecord* Find(const std::string& job_id) const;
  // The job's spec as submitted (after --set overrides), or nullptr for an unknown job.
  const JobSpec* SpecOf(const std::string& job_id) const;
  // The job a submit with this (non-empty) request id made, or nullptr.
  const v1::JobRecord* FindByRequestId(const std::string& request_id) const;
  // How many of `submitter`'s jobs are PENDING (queued, never placed yet).
  int PendingOf(const std::string& submitter) const;
  bool IsCurrent(const TrainerKey& key) const;  // a rank of a RUNNING job's current attempt
  int64_t HangTimeoutMs(const std::string& job_id) const;
  // The slot the trainer was placed on, if its attempt placed it on `node`.
  std::optional<int> SlotOf(const std::string& node, const TrainerKey& key) const;
  // The slots of `node` that ranks of RUNNING jobs' current attempts hold.
  std::vector<int> ReservedSlots(const std::string& node) const;
  std::vector<v1::AttemptRecord> Attempts(const std::string& job_id) const;
  std::vector<v1::TrainerStatus> CurrentTrainers(const std::string& job_id) const;
  // One page of the list, newest first (ListJobsRequest), records without spec_yaml. Walks
  // only the jobs it skips or returns, in submit order, not the whole history.
  v1::ListJobsResponse ListPage(const v1::ListJobsRequest& request) const;
  // How many jobs are in each state (a walk of every job; for /metrics, not per RPC).
  std::map<v1::JobState, int64_t> CountByState() const;

 private:
  struct Rank {
    v1::TrainerStatus status;
    bool acked = false;  // its agent listed it at least once
    bool done = false;   // exited 0
  };
  struct Job {
    v1::JobRecord rec;
    JobSpec spec;
    std::vector<int> feasible;
    std::map<int64_t, v1::AttemptRecord> attempts;
    std::vector<Rank> ranks;  // the current attempt's, while RUNNING
    int ranks_done = 0;       // how many of `ranks` are done
    std::string failure;      // why it is recovering
    std::string waiting;      // why it is not placed yet
    int64_t version = 0;      // counts Persist calls: what a CancelPlan was worked out from
    // Nodes where ranks of its failing attempts (this run of failures in a row) failed, and
    // those of the stragglers it moved (Replace) since. In memory only: a preference, lost
    // with a coordinator restart.
    std::set<std::string> avoid;
    std::optional<ResizePlan> resize;  // RUNNING: what it becomes at its next checkpoint
    struct CheckpointAsked {
      int64_t id = 0;          // CheckpointTrainersOrder.request_id: grows within a job
      int64_t after_step = 0;  // satisfied by a complete checkpoint of a later step
      std::string reason;
      bool for_resize = false;  // made by PlanResize, withdrawn with the plan
    };
    std::optional<CheckpointAsked> checkpoint_asked;  // RUNNING: a request still pending
    int64_t last_request_id = 0;
    int hold_size = 0;          // after a resize: placed only at this size or larger...
    int64_t hold_until_ms = 0;  // ...until this wall time
    // After a failure: until this wall time, it waits for the slots its stopped trainers
    // still hold (PendingJob::regrouping).
    int64_t regroup_until_ms = 0;
    // Trainers of any attempt whose exit said their GPU failed, each handed to slot_failed
    // once (an agent lists an exited trainer in several heartbeats).
    std::set<TrainerKey> device_faults;
    // RUNNING, replacing stragglers: each rank of the current attempt found straggling in
    // every check since this wall time, and the one to move at the next checkpoint.
    std::map<int, int64_t> straggling_since;
    struct Replacement {
      struct Straggler {
        std::string node;
        int slot = 0;
        std::string who;  // "rank 1 on w1 slot 0 (busy 81 ms a step, ...)"
      };
      // Their slots are cordoned at the checkpoint, their nodes avoided; none for an
      // operator's slot drain (PlanSlotDrain: its cordon is the operator's, the node fine).
      std::vector<Straggler> stragglers;
      int world_size = 0;  // the next attempt's: the job's (moved) or fewer
      std::string what;    // "replacing straggler rank 1 ..." / "dropping straggler rank 1 ..."
      std::string how;     // after a shrink's "at the checkpoint of step N": ", shrinking ..."
    };
    std::optional<Replacement> replace;
    // RUNNING: it has run for its time limit and was asked for its last checkpoint, at which
    // its attempt ends (CheckTimeLimits). In memory only: a restored job is asked again.
    bool time_up = false;
  };

  Job* Get(const std::string& job_id);
  const Job* Get(const std::string& job_id) const;
  const Rank* CurrentRank(const std::string& node, const TrainerKey& key) const;
  void UpdateReason(Job& job);
  // Ends the RUNNING attempt (recording why, at wall time now_ms) and returns its record.
  v1::AttemptRecord& EndAttempt(Job& job, const std::string& why, int64_t now_ms);
  // Ends the attempt, which failed on `node`; restarts the job (after its back-off delay)
  // unless `retry` is false or max_restarts is used up.
  // counted: the restart counts against max_restarts (not for a failed peer check, which
  // lost no training and names its node: see FailCutOff).
  void FailAttempt(Job& job, const std::string& why, const std::string& node, bool retry = true,
                   bool counted = true);
  // A failed exit whose trainer found ranks cut off from their peers: the attempt fails on
  // their nodes (not on the reporter's), which node_cut_off then cordons. The restart is not
  // counted against max_restarts: the check fails before any training, and its node is
  // kept out for a growing cool-down, which is what bounds how often it happens. A job that
  // grows back onto a node still cut off would otherwise spend its restarts, one per
  // cool-down, until it failed.
  void FailCutOff(Job& job, const v1::TrainerStatus& t, const std::string& reporter);
  // A trainer of any attempt, current or not, that exited with kExitDeviceFault: its slot
  // (the one its attempt placed it on) is handed to slot_failed, once per trainer. Any
  // attempt's: the GPU failed whichever attempt ran on it, and a peer that lost its
  // collective may have ended the attempt first.
  void NoteDeviceFault(const std::string& node, const v1::TrainerStatus& t);
  // Says in the job's reason how long its restart delay still lasts at wall time now_ms.
  void ShowRestartDelay(Job& job, int64_t now_ms);
  // Why `job` may not be placed yet for the jobs it runs after (JobRecord.after): "" when
  // each has SUCCEEDED, or once it has been placed.
  std::string AwaitedJobs(const Job& job) const;
  void Succeed(Job& job);
  // Makes (or keeps) the pending checkpoint request of a RUNNING job; its after_step.
  int64_t AskCheckpoint(Job& job, const std::string& reason, bool for_resize);
  // Ends the attempt at the complete checkpoint of `step` to restart it as job.resize says.
  void Resize(Job& job, int64_t step);
  // A plan of no change (kNone) of `job` as it is now: what each Plan* starts from.
  JobPlan NewPlan(const Job& job) const;
  // Makes a job asked to suspend (JobRecord.suspend), whose attempt has ended, SUSPENDED;
  // persists nothing.
  void MakeSuspended(Job& job);
  // " by ops@host: the Tuesday maintenance": who suspended the job and why, as far as known.
  static std::string SuspendedBy(const v1::JobRecord& rec);
  // The job's reason while asked to suspend: "suspending at its next checkpoint (...)" while
  // RUNNING, "suspended by ...; drover resume J places it again" once SUSPENDED.
  static std::string SuspendText(const v1::JobRecord& rec);
  // Plans the move (a spare slot exists) or the drop (ShrinkWithout pays) of `found`, the
  // stragglers of RUNNING `job`, those of them straggling for its replace_stragglers_after_s
  // at wall time now_ms, and asks for the checkpoint it happens at. True when it did.
  // pace_ms: the job's pace now (its ranks' slowest TrainerProgress.pace_ms).
  bool PlanReplacement(Job& job, const std::vector<Straggler>& found, double pace_ms,
                       int64_t now_ms, const std::function<bool(v1::DeviceKind)>& spare);
  // Ends the attempt to move or drop job.replace's stragglers, `when` ("at the checkpoint
  // of step N").
  void Replace(Job& job, const std::string& when);
  // resources.time_limit_minutes in milliseconds (0: none).
  static int64_t TimeLimitMs(const Job& job);
  // How long the job's attempts have run, as of wall time now_ms.
  int64_t RanMs(const Job& job, int64_t now_ms) const;
  // True when the job has a time limit and has run for it by wall time now_ms.
  bool TimeUsedUp(const Job& job, int64_t now_ms) const;
  // "time limit reached: it ran 2h00m of its 2h00m (resources.time_limit_minutes)".
  std::string TimeLimitReached(const Job& job, int64_t now_ms) const;
  // Ends the job, whose time limit is used up, FAILED at wall time now_ms, and its RUNNING
  // attempt; `how` says how it stopped ("stopped at the checkpoint of step 40 ...").
  void EndAtTimeLimit(Job& job, const std::string& how, int64_t now_ms);
  void Persist(Job& job, const v1::AttemptRecord* attempt);
  // Keeps live_ and finished_counts_ in step with job.rec's state after a change (every
  // change is persisted, or is a cancel; finished states are final).
  void Reindex(const Job& job);
  void IndexPlacement(const Job& job, bool add);

  const Clock* const clock_;
  JobManagerOptions options_;
  const Hooks hooks_;
  std::unordered_map<std::string, Job> jobs_;
  std::map<int64_t, std::string> by_seq_;  // submit_seq -> job id, for ListPage
  // The jobs not finished yet (PENDING, RUNNING, RECOVERING), as by_seq_: what the scheduler,
  // the submit limit, live-state lists and the dashboard walk, so that their cost does not
  // grow with the history (100,000 finished jobs took 42 ms a walk).
  std::map<int64_t, std::string> live_;
  std::map<v1::JobState, int64_t> finished_counts_;             // SUCCEEDED, FAILED, CANCELLED
  std::unordered_map<std::string, std::string> by_request_id_;  // request id -> job id
  // node -> RUNNING job -> the ranks of its current attempt placed on that node. Every
  // per-node operation (a heartbeat's listing and orders, a node's death, free slots) walks
  // only this, so its cost does not grow with the size of the jobs or of the cluster.
  std::unordered_map<std::string, std::map<std::string, std::vector<int>>> ranks_on_node_;
  int64_t next_restart_ms_ = INT64_MAX;  // the earliest restart_not_before_ms still ahead
};

}  // namespace drover::coordinator
