#include "coordinator/health_manager.h"

#include <algorithm>

namespace drover::coordinator {

HealthManager::HealthManager(int64_t heartbeat_timeout_ms)
    : heartbeat_timeout_ms_(heartbeat_timeout_ms) {}

void HealthManager::OnHeartbeat(const std::string& node, int64_t now_ms) {
  auto [it, inserted] = leases_.try_emplace(node);
  Lease& lease = it->second;
  lease.deadline_ms = now_ms + heartbeat_timeout_ms_;
  // The pending check is due no later than the deadline (deadlines only grow on a steady
  // clock); only a new lease, or one whose deadline moved earlier, needs a new check.
  if (inserted || lease.deadline_ms < lease.check_ms) {
    lease.gen = ++next_gen_;
    lease.check_ms = lease.deadline_ms;
    lease_checks_.push({lease.check_ms, lease.gen, node});
  }
}

void HealthManager::ForgetNode(const std::string& node) { leases_.erase(node); }

void HealthManager::OnConnectionLost(const std::string& node, int64_t now_ms, int64_t grace_ms) {
  auto it = leases_.find(node);
  if (it == leases_.end()) return;
  Lease& lease = it->second;
  lease.deadline_ms = std::min(lease.deadline_ms, now_ms + grace_ms);
  if (lease.deadline_ms < lease.check_ms) {
    lease.gen = ++next_gen_;
    lease.check_ms = lease.deadline_ms;
    lease_checks_.push({lease.check_ms, lease.gen, node});
  }
}

void HealthManager::OnTrainerProgress(const TrainerKey& key, int64_t step, int64_t hang_timeout_ms,
                                      int64_t now_ms, int64_t work) {
  if (hang_timeout_ms <= 0) return;
  auto [it, inserted] = progress_.try_emplace(key);
  Progress& p = it->second;
  if (inserted || p.step != step || p.work != work) {
    p.step = step;
    p.work = work;
    p.moved_ms = now_ms;
  }
  p.timeout_ms = hang_timeout_ms;
  const int64_t deadline = p.moved_ms + p.timeout_ms;
  if (inserted || deadline < p.check_ms) {
    p.gen = ++next_gen_;
    p.check_ms = deadline;
    hang_checks_.push({p.check_ms, p.gen, key});
  }
}

void HealthManager::ForgetTrainer(const TrainerKey& key) { progress_.erase(key); }

void HealthManager::ForgetAttempt(const std::string& job_id, int64_t attempt) {
  auto it = progress_.lower_bound(TrainerKey{job_id, attempt, INT32_MIN});
  while (it != progress_.end() && it->first.job_id == job_id && it->first.attempt == attempt) {
    it = progress_.erase(it);
  }
}

HealthManager::Events HealthManager::Tick(int64_t now_ms) {
  Events events;
  while (!lease_checks_.empty() && lease_checks_.top().due_ms <= now_ms) {
    Check<std::string> check = lease_checks_.top();
    lease_checks_.pop();
    auto it = leases_.find(check.key);
    if (it == leases_.end() || it->second.gen != check.gen) continue;
    Lease& lease = it->second;
    if (now_ms >= lease.deadline_ms) {
      events.dead_nodes.push_back(check.key);
      leases_.erase(it);  // reported once; a new heartbeat renews the lease
    } else {
      lease.check_ms = lease.deadline_ms;
      check.due_ms = lease.deadline_ms;
      lease_checks_.push(std::move(check));
    }
  }
  std::sort(events.dead_nodes.begin(), events.dead_nodes.end());
  while (!hang_checks_.empty() && hang_checks_.top().due_ms <= now_ms) {
    Check<TrainerKey> check = hang_checks_.top();
    hang_checks_.pop();
    auto it = progress_.find(check.key);
    if (it == progress_.end() || it->second.gen != check.gen) continue;
    Progress& p = it->second;
    if (now_ms - p.moved_ms >= p.timeout_ms) {
      events.hung.push_back(check.key);
      progress_.erase(it);
    } else {
      p.check_ms = p.moved_ms + p.timeout_ms;
      check.due_ms = p.check_ms;
      hang_checks_.push(std::move(check));
    }
  }
  std::sort(events.hung.begin(), events.hung.end());
  return events;
}

}  // namespace drover::coordinator
