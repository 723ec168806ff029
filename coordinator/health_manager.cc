#include "coordinator/health_manager.h"

#include <algorithm>

namespace drover::coordinator {

HealthManager::HealthManager(int64_t heartbeat_timeout_ms)
    : heartbeat_timeout_ms_(heartbeat_timeout_ms) {}

void HealthManager::OnHeartbeat(const std::string& node, int64_t now_ms) {
  deadline_ms_[node] = now_ms + heartbeat_timeout_ms_;
}

void HealthManager::ForgetNode(const std::string& node) { deadline_ms_.erase(node); }

void HealthManager::OnTrainerProgress(const TrainerKey& key, int64_t step, int64_t hang_timeout_ms,
                                      int64_t now_ms) {
  if (hang_timeout_ms <= 0) return;
  auto [it, inserted] = progress_.try_emplace(key);
  Progress& p = it->second;
  if (inserted || p.step != step) {
    p.step = step;
    p.moved_ms = now_ms;
  }
  p.timeout_ms = hang_timeout_ms;
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
  for (auto it = deadline_ms_.begin(); it != deadline_ms_.end();) {
    if (now_ms >= it->second) {
      events.dead_nodes.push_back(it->first);
      it = deadline_ms_.erase(it);  // reported once; a new heartbeat renews the lease
    } else {
      ++it;
    }
  }
  std::sort(events.dead_nodes.begin(), events.dead_nodes.end());
  for (auto it = progress_.begin(); it != progress_.end();) {
    if (now_ms - it->second.moved_ms >= it->second.timeout_ms) {
      events.hung.push_back(it->first);
      it = progress_.erase(it);
    } else {
      ++it;
    }
  }
  return events;
}

}  // namespace drover::coordinator
