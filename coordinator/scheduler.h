// Scheduler: places pending jobs onto free slots. A pure function of its inputs, so it is
// tested without any other manager.
//
// Policy: gang scheduling (every rank of a job or none); jobs in order of priority (higher
// first), FIFO (submit_seq) within a priority, and a job that cannot start yet blocks the
// jobs behind it on the same device kind, so a big job is never starved by small ones.
// Elastic: a job gets the largest of its feasible world sizes that fits the free slots.
// Packing: ranks go onto as few nodes as possible (one node when any can hold the job,
// the fullest-fitting one; otherwise the nodes with the most free slots first), and when
// they span nodes, each block of consecutive ranks that talk the most (JobSpec::RankBlock:
// a tensor-parallel group, a hybrid shard group) on one node where the free slots allow:
// a node takes whole blocks first, and the ranks of blocks that fit no node whole fill the
// slots left over.
// Whole blocks over size: a job in blocks gets the largest feasible size at which every
// block fits on one node, smaller than what the free slots would give it if need be, down
// to half of that (a block across nodes puts the network into every step: a
// tensor-parallel all-reduce per layer, a ZeRO-3 gather per unit, and the whole job steps
// at that block's pace). Only where no such size keeps the blocks whole do they span
// nodes. Growth follows the same rule, so that a job never grows into a split block
// (PlanGrowth).
// Avoidance: a job that failed on some nodes is packed onto the others when its gang fits
// there at the size it gets, and onto the nodes it avoids only when it does not (it is
// never shrunk nor held back to avoid them).
// Regrouping: a job whose attempt just failed, while trainers of that attempt still hold
// slots on nodes that can take work (stopped, not exited yet), is not placed at a size
// smaller than those slots would give it: started at once on the slots free now, it would
// run smaller and grow back at its next checkpoint, a second restart for nothing. It waits
// in its place in the queue; the caller bounds how long (JobManager: the stop grace and a
// second).
// A job that could never fit, even on every slot the cluster ever registered, does not
// block others and gets a reason saying so.
// Backfill (Backfill): behind a blocked job, a job with a time limit that ends before the
// blocked one can start for certain, or one that takes only slots it will not need then,
// starts at once instead of leaving those slots idle.
// Growth (PlanGrowth): a RUNNING job below its largest feasible world size grows into the
// slots that are still free after the pending jobs were placed, and only on a device where
// no pending job is waiting for slots (queued jobs come before growing ones).
// Preemption (PlanPreemption): where the job at the head of a device's queue waits for
// slots, RUNNING jobs of lower priority make room for it at their next checkpoints: the
// lowest priority first (the latest submitted first within one), each shrunk as little as
// its feasible world sizes allow, and yielding every slot only when shrinking them all to
// their smallest sizes is not enough. Nothing is preempted when even that would not make
// room, nor for slots that ended attempts are about to give back.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "proto/drover.pb.h"

namespace drover::coordinator {

struct NodeCapacity {
  std::string name;
  v1::DeviceKind device = v1::CPU;
  std::vector<int> free_slots;  // slot indices, ascending
};

struct PendingJob {
  std::string job_id;
  int priority = 0;
  int64_t submit_seq = 0;
  v1::DeviceKind device = v1::CPU;
  std::vector<int> feasible_world_sizes;  // ascending; empty: no layout works
  std::set<std::string> avoid_nodes;      // used only when the gang fits nowhere else
  bool regrouping = false;                // its attempt just failed (JobManager::Pending)
  int held_slots = 0;  // regrouping: slots its stopped trainers hold, about to be given back
  int rank_block = 1;  // JobSpec::RankBlock
  // What its time limit (resources.time_limit_minutes) leaves it to run; 0: no limit.
  // Backfill reads it.
  int64_t time_left_ms = 0;
};

struct Placement {
  std::string job_id;
  int world_size = 0;
  std::vector<v1::RankAssignment> ranks;  // rank r at index r
  // Why it got fewer ranks than the free slots allowed (whole blocks), or empty.
  std::string note = {};
};

// The first job in a device's queue that waits for slots (and so holds back the jobs
// behind it there).
struct BlockedJob {
  std::string job_id;
  int priority = 0;
  int min_size = 0;  // its smallest feasible world size
  // It waits for the slots its stopped trainers still hold (PendingJob::regrouping): they are
  // back within seconds, so nothing backfills before it.
  bool regrouping = false;
};

struct ScheduleResult {
  std::vector<Placement> placements;
  std::map<std::string, std::string> waiting;  // job id -> why it is still pending
  // After the placements: free slots per device, and per device the job that could fit
  // some day and still waits for slots (none: the device is not contended).
  std::map<v1::DeviceKind, int64_t> free_left;
  std::map<v1::DeviceKind, BlockedJob> blocked;
  // The jobs that wait only because a blocked job is ahead of them on their device (what
  // Backfill may start).
  std::set<std::string> queued_behind;
  // The free slots of each node after the placements (growth in whole blocks reads them).
  std::vector<NodeCapacity> nodes_left;
};

struct RunningJob {
  std::string job_id;
  int priority = 0;
  int64_t submit_seq = 0;
  v1::DeviceKind device = v1::CPU;
  int world_size = 0;                          // of its current attempt
  std::vector<int> feasible_world_sizes;       // ascending
  int rank_block = 1;                          // JobSpec::RankBlock
  std::vector<v1::RankAssignment> ranks = {};  // its current placement (read when rank_block > 1)
};

// `total_slots_ever`: per device, every slot of every node ever registered.
ScheduleResult Schedule(std::vector<PendingJob> jobs, std::vector<NodeCapacity> nodes,
                        const std::map<v1::DeviceKind, int64_t>& total_slots_ever);

// For each of `jobs` (in priority, then submit order), the world size it should grow to:
// the largest feasible size whose extra ranks fit in what `result` left free on its device
// (each job's growth takes its slots from the next), or 0 when it should not grow now. A job
// in blocks (rank_block > 1) grows to the size Schedule would place it at on its own slots
// and those left free (result.nodes_left): in whole blocks where any size keeps them whole.
std::map<std::string, int> PlanGrowth(std::vector<RunningJob> jobs, const ScheduleResult& result);

// What a RUNNING job becomes at its next complete checkpoint.
struct ResizePlan {
  int world_size = 0;  // its next attempt's size; 0: it yields every slot and waits
  BlockedJob for_job;  // the job it makes room for (empty job_id: it grows into free slots)
};

// For the RUNNING `jobs` that can resize (they save checkpoints), which make room for the
// job blocking each device in `result`, and how. `releasing`: per device, the slots that
// trainers of ended attempts still hold and are about to give back.
std::map<std::string, ResizePlan> PlanPreemption(
    std::vector<RunningJob> jobs, const ScheduleResult& result,
    const std::map<v1::DeviceKind, int64_t>& releasing);

// Slots a RUNNING job gives back by its time limit at the latest: `slots` of `device` in
// `in_ms` (0: at once, as the slots that trainers of ended attempts still hold).
struct SlotRelease {
  v1::DeviceKind device = v1::CPU;
  int64_t slots = 0;
  int64_t in_ms = 0;
};

// Backfill (Slurm's EASY backfill) after Schedule: on each device where `result` left a job
// blocked, and where no lower-priority job is making room for it (`preempting`: PlanPreemption
// planned a shrink for it), that job gets a reservation: the earliest time its smallest size
// is free for certain, counting the slots free now, `releases` (the running jobs with time
// limits, by those limits) and this pass's placements (by theirs). The jobs queued behind it
// (`jobs`: every pending job, as Schedule took them) then start, in queue order, on the
// slots free now where that cannot delay the reservation: a job whose time left ends by it,
// or one of any length that takes only slots the blocked job will not need then (the
// reservation's extra). Each is placed as Schedule places a job, at the largest feasible size
// that qualifies. Without a reservation (the slots it needs are held by jobs without time
// limits) nothing backfills on that device. The placements are added to `result` (its
// nodes_left, free_left and waiting follow) and returned.
std::vector<Placement> Backfill(std::vector<PendingJob> jobs,
                                const std::vector<SlotRelease>& releases,
                                const std::set<v1::DeviceKind>& preempting, ScheduleResult* result);

// The ranks of a `world_size` job packed onto `nodes` (which must hold enough free slots),
// in blocks of `rank_block` consecutive ranks (see Packing above).
std::vector<v1::RankAssignment> PackRanks(int world_size, const std::vector<NodeCapacity>& nodes,
                                          int rank_block = 1);

}  // namespace drover::coordinator
