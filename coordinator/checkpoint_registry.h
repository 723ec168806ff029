// CheckpointRegistry: the complete checkpoints each job reported (rank 0 reports a
// step_N/ directory only once it is complete), and the newest one to resume from.
//
// Not thread-safe: the coordinator calls it under its state lock.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "proto/drover.pb.h"

namespace drover::coordinator {

class CheckpointRegistry {
 public:
  // Returns true when the record is new (to be persisted); a repeat of a known (job, step)
  // is ignored, since agents re-send a record until a heartbeat carrying it succeeds.
  bool Add(const v1::CheckpointRecord& record);

  // The newest (highest step) checkpoint of the job, or nullptr.
  const v1::CheckpointRecord* Newest(const std::string& job_id) const;

  std::vector<v1::CheckpointRecord> ForJob(const std::string& job_id) const;

  // Drops the job's records (the job was deleted).
  void Forget(const std::string& job_id) { by_job_.erase(job_id); }

 private:
  std::map<std::string, std::map<int64_t, v1::CheckpointRecord>> by_job_;  // job -> step
};

}  // namespace drover::coordinator
