// HealthManager: decides when a node is dead (no heartbeat for heartbeat_timeout) and when
// a trainer hangs (its step counter has not moved for its job's hang timeout).
//
// Pure bookkeeping driven by the caller: heartbeats and progress go in, Tick(now) says what
// expired since the last Tick. Each expiry is reported once. Not thread-safe: the
// coordinator calls it under its state lock; tests drive it with a FakeClock's NowMs().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <queue>
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
  // The node's agent connection closed (its process died, or the connection broke): it is
  // dead at now_ms + grace_ms unless a heartbeat renews its lease before (a live agent
  // heartbeats at once when its connection breaks). Never extends a lease.
  void OnConnectionLost(const std::string& node, int64_t now_ms, int64_t grace_ms);

  // A live trainer's step as last reported, and its count of work between steps
  // (TrainerProgress.work). `hang_timeout_ms` <= 0 disables hang detection. The clock starts
  // at the first report; it restarts each time `step` or `work` changes.
  void OnTrainerProgress(const TrainerKey& key, int64_t step, int64_t hang_timeout_ms,
                         int64_t now_ms, int64_t work = 0);
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
  // Each watched node and trainer has one pending check in a min-heap, due when its
  // deadline was as of the last check. A heartbeat or a moved step only updates the
  // deadline in the table; a check that comes due and finds the deadline moved is pushed
  // again for the new one. So a heartbeat costs one hash update, and Tick costs
  // O(checks due x log n) instead of a walk over every node and trainer (10,000 nodes with
  // 40,000 trainers, ten ticks a second). A check whose `gen` no longer matches its entry
  // (forgotten, or superseded by an earlier deadline) is dropped when popped.
  template <typename Key>
  struct Check {
    int64_t due_ms;
    uint64_t gen;
    Key key;
    bool operator>(const Check& o) const { return due_ms > o.due_ms; }
  };
  template <typename Key>
  using CheckHeap = std::priority_queue<Check<Key>, std::vector<Check<Key>>, std::greater<>>;
  struct Lease {
    int64_t deadline_ms = 0;
    int64_t check_ms = 0;  // when its pending check is due
    uint64_t gen = 0;
  };
  struct Progress {
    int64_t step = 0;
    int64_t work = 0;
    int64_t moved_ms = 0;
    int64_t timeout_ms = 0;
    int64_t check_ms = 0;
    uint64_t gen = 0;
  };

  const int64_t heartbeat_timeout_ms_;
  uint64_t next_gen_ = 0;
  std::unordered_map<std::string, Lease> leases_;
  CheckHeap<std::string> lease_checks_;
  std::map<TrainerKey, Progress> progress_;  // ordered: ForgetAttempt erases a range
  CheckHeap<TrainerKey> hang_checks_;
};

}  // namespace drover::coordinator
