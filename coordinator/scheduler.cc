#include "coordinator/scheduler.h"

#include <algorithm>
#include <optional>
#include <set>

#include "common/duration.h"
#include "common/status.h"

namespace drover::coordinator {
namespace {

std::string DeviceName(v1::DeviceKind d) { return d == v1::CUDA ? "cuda" : "cpu"; }

int64_t FreeCount(const std::vector<NodeCapacity>& nodes, v1::DeviceKind device) {
  int64_t n = 0;
  for (const auto& node : nodes) {
    if (node.device == device) n += static_cast<int64_t>(node.free_slots.size());
  }
  return n;
}

// Removes the slots `ranks` took from `nodes`.
void Take(const std::vector<v1::RankAssignment>& ranks, std::vector<NodeCapacity>* nodes) {
  std::set<std::pair<std::string, int>> taken;
  for (const auto& r : ranks) taken.emplace(r.node(), r.slot());
  for (auto& node : *nodes) {
    std::erase_if(node.free_slots, [&](int s) { return taken.count({node.name, s}) > 0; });
  }
}

// The queue's order, of pending and running jobs alike: higher priority first, then earlier
// submitted.
template <typename Job>
bool QueueOrder(const Job& a, const Job& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  return a.submit_seq < b.submit_seq;
}

// Blocks of `block` ranks that `nodes`' free slots hold, each block on one node.
int64_t WholeBlocks(const std::vector<NodeCapacity>& nodes, int block) {
  int64_t n = 0;
  for (const auto& node : nodes) n += static_cast<int64_t>(node.free_slots.size()) / block;
  return n;
}

// The largest of `feasible` (ascending), at most `limit`, at which every block of `block`
// consecutive ranks fits on one node of `nodes`; 0 when none does.
int LargestWhole(const std::vector<int>& feasible, int limit,
                 const std::vector<NodeCapacity>& nodes, int block) {
  const int64_t blocks = WholeBlocks(nodes, block);
  int best = 0;
  for (int s : feasible) {
    if (s <= limit && s % block == 0 && s / block <= blocks) best = std::max(best, s);
  }
  return best;
}

// The size a job of `rank_block` gets where the largest that fits `nodes` is `size`: the
// largest that keeps its blocks whole, when that is at least half of `size`; else `size`
// (and so also for a job without blocks). The bound caps what whole blocks may cost at
// half the job's ranks, about what one block across nodes costs it: its every step
// waits on that block's traffic over the network.
int WholeBlockSize(const std::vector<int>& feasible, int size,
                   const std::vector<NodeCapacity>& nodes, int rank_block) {
  if (rank_block <= 1) return size;
  const int whole = LargestWhole(feasible, size, nodes, rank_block);
  return 2 * whole >= size ? whole : size;
}

// Places `job` at `size` ranks (or fewer, to keep its blocks whole: WholeBlockSize) on the
// free slots of `nodes` of its device, which must hold `size`, and takes them from `nodes`.
Placement Place(const PendingJob& job, int size, std::vector<NodeCapacity>* nodes) {
  std::vector<NodeCapacity> usable;
  for (const auto& n : *nodes) {
    if (n.device == job.device) usable.push_back(n);
  }
  Placement p;
  p.job_id = job.job_id;
  p.world_size = WholeBlockSize(job.feasible_world_sizes, size, usable, job.rank_block);
  if (p.world_size < size) {
    p.note = "placed at " + std::to_string(p.world_size) + " ranks, not the " +
             std::to_string(size) + " that fit: at " + std::to_string(size) + ", a block of " +
             std::to_string(job.rank_block) + " ranks (parallel.tp x dp_shard) would span nodes";
  }
  std::vector<NodeCapacity> preferred;
  for (const auto& n : usable) {
    if (!job.avoid_nodes.count(n.name)) preferred.push_back(n);
  }
  // The avoided nodes are left out where the gang fits without them, as whole as it
  // would be with them.
  const bool whole =
      job.rank_block > 1 && WholeBlocks(usable, job.rank_block) * job.rank_block >= p.world_size;
  const bool fits_preferred =
      FreeCount(preferred, job.device) >= p.world_size &&
      (!whole || WholeBlocks(preferred, job.rank_block) * job.rank_block >= p.world_size);
  p.ranks = PackRanks(p.world_size, fits_preferred ? preferred : usable, job.rank_block);
  Take(p.ranks, nodes);
  return p;
}

}  // namespace

std::vector<v1::RankAssignment> PackRanks(int world_size, const std::vector<NodeCapacity>& nodes,
                                          int rank_block) {
  std::vector<const NodeCapacity*> order;
  for (const auto& n : nodes) {
    if (!n.free_slots.empty()) order.push_back(&n);
  }
  // Best fit on one node when possible: the node with the fewest free slots that still
  // holds the whole job keeps the big holes for big jobs.
  const NodeCapacity* single = nullptr;
  for (const NodeCapacity* n : order) {
    if (static_cast<int>(n->free_slots.size()) >= world_size &&
        (!single || n->free_slots.size() < single->free_slots.size())) {
      single = n;
    }
  }
  if (single) {
    order = {single};
  } else {
    std::stable_sort(order.begin(), order.end(), [](const NodeCapacity* a, const NodeCapacity* b) {
      return a->free_slots.size() > b->free_slots.size();
    });
  }
  // First whole blocks on each node in that order, then what is left of the job, rank by
  // rank, on the slots left over (with blocks of one rank, the first pass places them all).
  const int block = std::max(rank_block, 1);
  std::vector<v1::RankAssignment> ranks;
  std::vector<size_t> used(order.size(), 0);  // slots of order[i] taken
  std::vector<int> local(order.size(), 0);
  auto assign = [&](size_t i) {
    v1::RankAssignment r;
    r.set_rank(static_cast<int>(ranks.size()));
    r.set_node(order[i]->name);
    r.set_slot(order[i]->free_slots[used[i]++]);
    r.set_local_rank(local[i]++);
    ranks.push_back(std::move(r));
  };
  const int whole_blocks = world_size / block;
  for (size_t i = 0; i < order.size(); ++i) {
    int fits = static_cast<int>(order[i]->free_slots.size()) / block;
    while (fits-- > 0 && static_cast<int>(ranks.size()) < whole_blocks * block) {
      for (int k = 0; k < block; ++k) assign(i);
    }
  }
  for (size_t i = 0; i < order.size(); ++i) {
    while (used[i] < order[i]->free_slots.size() && static_cast<int>(ranks.size()) < world_size) {
      assign(i);
    }
  }
  DROVER_CHECK_MSG(static_cast<int>(ranks.size()) == world_size, "PackRanks: not enough slots");
  return ranks;
}

ScheduleResult Schedule(std::vector<PendingJob> jobs, std::vector<NodeCapacity> nodes,
                        const std::map<v1::DeviceKind, int64_t>& total_slots_ever) {
  std::stable_sort(jobs.begin(), jobs.end(), QueueOrder<PendingJob>);
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeCapacity& a, const NodeCapacity& b) { return a.name < b.name; });
  ScheduleResult result;
  std::map<v1::DeviceKind, BlockedJob>& blocked = result.blocked;
  for (const PendingJob& job : jobs) {
    const std::string dev = DeviceName(job.device);
    if (job.feasible_world_sizes.empty()) {
      result.waiting[job.job_id] = "no world size in resources.world_size fits the parallel layout";
      continue;
    }
    const int min_size = job.feasible_world_sizes.front();
    auto ever = total_slots_ever.find(job.device);
    int64_t ever_slots = ever == total_slots_ever.end() ? 0 : ever->second;
    if (min_size > ever_slots) {
      result.waiting[job.job_id] = "can never fit yet: needs at least " + std::to_string(min_size) +
                                   " " + dev + " slots, the cluster has registered " +
                                   std::to_string(ever_slots) + " in all (waiting for nodes)";
      continue;
    }
    if (blocked.count(job.device)) {
      result.waiting[job.job_id] = "queued behind an earlier " + dev + " job";
      result.queued_behind.insert(job.job_id);
      continue;
    }
    std::vector<NodeCapacity> usable;
    for (const auto& n : nodes) {
      if (n.device == job.device) usable.push_back(n);
    }
    const int64_t free = FreeCount(usable, job.device);
    int size = 0;
    for (int s : job.feasible_world_sizes) {
      if (s <= free) size = std::max(size, s);
    }
    int regrouped = size;  // its size once its stopped trainers' slots are back
    for (int s : job.feasible_world_sizes) {
      if (s <= free + job.held_slots) regrouped = std::max(regrouped, s);
    }
    if (regrouped > size) {
      result.waiting[job.job_id] = "waiting for the " + std::to_string(job.held_slots) + " " + dev +
                                   (job.held_slots == 1 ? " slot" : " slots") +
                                   " its stopped trainers still hold (" + std::to_string(free) +
                                   " free now), to restart at " + std::to_string(regrouped) +
                                   " ranks";
    } else if (size == 0) {
      result.waiting[job.job_id] = "waiting for " + std::to_string(min_size) + " free " + dev +
                                   " slots (" + std::to_string(free) + " free)";
    }
    if (size == 0 || regrouped > size) {
      // Gang + FIFO: nobody behind it jumps the queue (but where Backfill finds that a job
      // cannot delay it).
      blocked[job.device] = {job.job_id, job.priority, min_size, regrouped > size};
      continue;
    }
    result.placements.push_back(Place(job, size, &nodes));
  }
  for (v1::DeviceKind d : {v1::CPU, v1::CUDA}) result.free_left[d] = FreeCount(nodes, d);
  result.nodes_left = std::move(nodes);
  return result;
}

std::map<std::string, int> PlanGrowth(std::vector<RunningJob> jobs, const ScheduleResult& result) {
  std::stable_sort(jobs.begin(), jobs.end(), QueueOrder<RunningJob>);
  std::map<v1::DeviceKind, int64_t> free = result.free_left;
  std::vector<NodeCapacity> nodes_left = result.nodes_left;
  std::map<std::string, int> plan;
  for (const RunningJob& job : jobs) {
    int target = 0;
    if (!result.blocked.count(job.device)) {
      for (int s : job.feasible_world_sizes) {
        if (s > job.world_size && s - job.world_size <= free[job.device]) target = s;
      }
    }
    std::vector<NodeCapacity> own_and_free;
    if (target > 0 && job.rank_block > 1) {
      // Its next attempt is placed on its own slots and the free ones, as Schedule places it.
      std::map<std::string, NodeCapacity> by_node;
      for (const auto& n : nodes_left) {
        if (n.device == job.device) by_node[n.name] = n;
      }
      for (const auto& r : job.ranks) {
        NodeCapacity& n = by_node[r.node()];
        n.name = r.node();
        n.device = job.device;
        n.free_slots.push_back(r.slot());
      }
      for (auto& [name, n] : by_node) {
        std::sort(n.free_slots.begin(), n.free_slots.end());
        own_and_free.push_back(std::move(n));
      }
      target = WholeBlockSize(job.feasible_world_sizes, target, own_and_free, job.rank_block);
      if (target <= job.world_size) target = 0;
    }
    if (target > 0) {
      free[job.device] -= target - job.world_size;
      // The slots it grows into are no longer free for the jobs after it.
      if (job.rank_block > 1) Take(PackRanks(target, own_and_free, job.rank_block), &nodes_left);
    }
    plan[job.job_id] = target;
  }
  return plan;
}

std::map<std::string, ResizePlan> PlanPreemption(
    std::vector<RunningJob> jobs, const ScheduleResult& result,
    const std::map<v1::DeviceKind, int64_t>& releasing) {
  // Victims in the order they give up slots: lowest priority, then latest submitted.
  std::stable_sort(jobs.begin(), jobs.end(), [](const RunningJob& a, const RunningJob& b) {
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.submit_seq > b.submit_seq;
  });
  auto count = [](const std::map<v1::DeviceKind, int64_t>& m, v1::DeviceKind d) -> int64_t {
    auto it = m.find(d);
    return it == m.end() ? 0 : it->second;
  };
  std::map<std::string, ResizePlan> plan;
  for (const auto& [device, head] : result.blocked) {
    int64_t need = head.min_size - count(result.free_left, device) - count(releasing, device);
    if (need <= 0) continue;
    std::vector<const RunningJob*> victims;
    int64_t held = 0;
    for (const RunningJob& j : jobs) {
      if (j.device != device || j.priority >= head.priority || j.world_size <= 0) continue;
      victims.push_back(&j);
      held += j.world_size;
    }
    if (held < need) continue;  // preempting them all would not make room
    std::map<const RunningJob*, int> size;
    // First shrink: each victim to the largest feasible size that gives what is still
    // needed, or to its smallest.
    for (const RunningJob* v : victims) {
      if (need <= 0) break;
      int to = v->world_size;
      for (int s : v->feasible_world_sizes) {
        if (s >= v->world_size) break;
        if (to == v->world_size || v->world_size - s >= need) to = s;
      }
      if (to == v->world_size) continue;  // already at its smallest
      size[v] = to;
      need -= v->world_size - to;
    }
    // Then, if shrinking was not enough, whole jobs yield, in the same order.
    for (const RunningJob* v : victims) {
      if (need <= 0) break;
      auto it = size.find(v);
      need -= it == size.end() ? v->world_size : it->second;
      size[v] = 0;
    }
    for (const auto& [v, to] : size) plan[v->job_id] = {to, head};
  }
  return plan;
}

namespace {

// When device's blocked `head` can start at the latest, counting the slots free now and
// those `releases` gives back (by their time limits): {in_ms, extra}, extra being the slots
// free then beyond the head's smallest size; nullopt when the releases never free enough.
struct Reservation {
  int64_t in_ms = 0;
  int64_t extra = 0;
};
std::optional<Reservation> ReserveFor(const BlockedJob& head, int64_t free_now,
                                      std::vector<SlotRelease> releases) {
  std::stable_sort(releases.begin(), releases.end(),
                   [](const SlotRelease& a, const SlotRelease& b) { return a.in_ms < b.in_ms; });
  int64_t free = free_now;
  for (size_t i = 0; i < releases.size(); ++i) {
    free += releases[i].slots;
    // Slots given back at the same moment count together.
    if (i + 1 < releases.size() && releases[i + 1].in_ms == releases[i].in_ms) continue;
    if (free >= head.min_size) return Reservation{releases[i].in_ms, free - head.min_size};
  }
  return std::nullopt;
}

}  // namespace

std::vector<Placement> Backfill(std::vector<PendingJob> jobs,
                                const std::vector<SlotRelease>& releases,
                                const std::set<v1::DeviceKind>& preempting,
                                ScheduleResult* result) {
  std::stable_sort(jobs.begin(), jobs.end(), QueueOrder<PendingJob>);
  std::map<std::string, const PendingJob*> by_id;
  for (const PendingJob& j : jobs) by_id[j.job_id] = &j;
  std::vector<Placement> placed;
  for (const auto& [device, head] : result->blocked) {
    if (head.regrouping || preempting.count(device)) continue;
    std::vector<SlotRelease> on_device;
    for (const SlotRelease& r : releases) {
      if (r.device == device && r.slots > 0) on_device.push_back(r);
    }
    // This pass's placements give their slots back by their time limits too.
    for (const Placement& p : result->placements) {
      auto it = by_id.find(p.job_id);
      if (it == by_id.end() || it->second->device != device) continue;
      if (it->second->time_left_ms > 0) {
        on_device.push_back({device, p.world_size, it->second->time_left_ms});
      }
    }
    int64_t free = FreeCount(result->nodes_left, device);  // kept as jobs take slots
    std::optional<Reservation> reserved = ReserveFor(head, free, std::move(on_device));
    if (!reserved) continue;
    for (const PendingJob& job : jobs) {
      if (job.device != device || !result->queued_behind.count(job.job_id) || job.regrouping) {
        continue;
      }
      // It starts now where it cannot delay the head's start.
      const bool ends_first = job.time_left_ms > 0 && job.time_left_ms <= reserved->in_ms;
      const int64_t fits = ends_first ? free : std::min(free, reserved->extra);
      int size = 0;
      for (int s : job.feasible_world_sizes) {
        if (s <= fits) size = s;
      }
      if (size == 0) {
        // What would let it start before the head: a limit that ends by the reservation.
        if (auto it = result->waiting.find(job.job_id); it != result->waiting.end()) {
          it->second += " (" + head.job_id + " can start within " +
                        FormatDurationMs(reserved->in_ms) +
                        " for certain; a job whose time limit ends by then starts before it)";
        }
        continue;
      }
      Placement p = Place(job, size, &result->nodes_left);
      free -= p.world_size;
      if (!ends_first) reserved->extra -= p.world_size;
      const std::string why = "started before " + head.job_id +
                              ", which waits for slots, by backfill: " +
                              (ends_first ? "its time limit ends before that job can start"
                                          : "on slots that job will not need when it starts");
      p.note = p.note.empty() ? why : p.note + "; " + why;
      result->waiting.erase(job.job_id);
      result->queued_behind.erase(job.job_id);
      result->placements.push_back(p);
      placed.push_back(std::move(p));
    }
    result->free_left[device] = free;
  }
  return placed;
}

}  // namespace drover::coordinator
