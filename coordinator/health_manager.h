// HealthManager: decides when a node is dead (no heartbeat for heartbeat_timeout) and when
// a trainer hangs (its step counter has not moved for its job's hang timeout).
//
// Pure bookkeeping driven by the caller: heartbeats and progress go in, Tick(now) says what
// expired since the last Tick. Each expiry is reported once. Not thread-safe: the
// coordinator calls it under its state lock; tests drive it with a FakeClock's NowMs().
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/trainer_key.h"

namespace drover::coordinator {

class HealthManager {
 public:
  explicit HealthManager(int64_t heartbeat_timeout_ms);

  // Starts or renews the node's lease: it is dead after now_ms + heartbeat_timeout without
  // another heartbeat. Also used to give restored nodes a grace period after a restart.
  void OnHeartbeat(const std::string& node, int64_t now_ms);
  void ForgetNode(const std::string& node);

  // A live trainer's step as last reported. `hang_timeout_ms` <= 0 disables hang detection.
  // The clock starts at the first report; it restarts each time `step` changes.
  void OnTrainerProgress(const TrainerKey& key, int64_t step, int64_t hang_timeout_ms,
                         int64_t now_ms);
  // Stops watching one trainer (it exited) or every trainer of (job, attempt) (it ended).
  void ForgetTrainer(const TrainerKey& key);
  void ForgetAttempt(const std::string& job_id, int64_t attempt);

  struct Events {
    std::vector<std::string> dead_nodes;  // ordered by name
    std::vector<TrainerKey> hung;         // ordered by key
  };
  Events Tick(int64_t now_ms);

  int64_t heartbeat_timeout_ms() const { return heartbeat_timeout_ms_; }

 private:
  struct Progress {
    int64_t step = 0;
    int64_t moved_ms = 0;
    int64_t timeout_ms = 0;
  };
  const int64_t heartbeat_timeout_ms_;
  std::unordered_map<std::string, int64_t> deadline_ms_;  // node -> lease end
  std::map<TrainerKey, Progress> progress_;
};

}  // namespace drover::coordinator
