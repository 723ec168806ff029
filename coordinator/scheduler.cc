#include "coordinator/scheduler.h"

#include <algorithm>
#include <set>

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

}  // namespace

std::vector<v1::RankAssignment> PackRanks(int world_size, const std::vector<NodeCapacity>& nodes) {
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
  std::vector<v1::RankAssignment> ranks;
  for (const NodeCapacity* n : order) {
    int local = 0;
    for (int slot : n->free_slots) {
      if (static_cast<int>(ranks.size()) == world_size) break;
      v1::RankAssignment r;
      r.set_rank(static_cast<int>(ranks.size()));
      r.set_node(n->name);
      r.set_slot(slot);
      r.set_local_rank(local++);
      ranks.push_back(std::move(r));
    }
  }
  DROVER_CHECK_MSG(static_cast<int>(ranks.size()) == world_size, "PackRanks: not enough slots");
  return ranks;
}

ScheduleResult Schedule(std::vector<PendingJob> jobs, std::vector<NodeCapacity> nodes,
                        const std::map<v1::DeviceKind, int64_t>& total_slots_ever) {
  std::stable_sort(jobs.begin(), jobs.end(), [](const PendingJob& a, const PendingJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.submit_seq < b.submit_seq;
  });
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeCapacity& a, const NodeCapacity& b) { return a.name < b.name; });
  ScheduleResult result;
  std::set<v1::DeviceKind> blocked;
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
    if (size == 0) {
      result.waiting[job.job_id] = "waiting for " + std::to_string(min_size) + " free " + dev +
                                   " slots (" + std::to_string(free) + " free)";
      blocked.insert(job.device);  // gang + FIFO: nobody behind it jumps the queue
      continue;
    }
    std::vector<NodeCapacity> preferred;
    for (const auto& n : usable) {
      if (!job.avoid_nodes.count(n.name)) preferred.push_back(n);
    }
    Placement p;
    p.job_id = job.job_id;
    p.world_size = size;
    p.ranks = PackRanks(size, FreeCount(preferred, job.device) >= size ? preferred : usable);
    Take(p.ranks, &nodes);
    result.placements.push_back(std::move(p));
  }
  for (v1::DeviceKind d : {v1::CPU, v1::CUDA}) result.free_left[d] = FreeCount(nodes, d);
  result.contended = std::move(blocked);
  return result;
}

std::map<std::string, int> PlanGrowth(std::vector<RunningJob> jobs, const ScheduleResult& result) {
  std::stable_sort(jobs.begin(), jobs.end(), [](const RunningJob& a, const RunningJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.submit_seq < b.submit_seq;
  });
  std::map<v1::DeviceKind, int64_t> free = result.free_left;
  std::map<std::string, int> plan;
  for (const RunningJob& job : jobs) {
    int target = 0;
    if (!result.contended.count(job.device)) {
      for (int s : job.feasible_world_sizes) {
        if (s > job.world_size && s - job.world_size <= free[job.device]) target = s;
      }
    }
    if (target > 0) free[job.device] -= target - job.world_size;
    plan[job.job_id] = target;
  }
  return plan;
}

}  // namespace drover::coordinator
