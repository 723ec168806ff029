// The coordinator's durable state, as an interface: SqliteStore (sqlite_store.h) is the one
// production implementation; tests wrap it to inject write errors
// (tests/unit/coordinator/fault_injection_store.h), the way leveldb's
// FaultInjectionTestEnv wraps its Env.
//
// A state transition is one StoreBatch, written in one transaction: after a crash or a
// failed write the store holds either all of a batch or none of it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/drover.pb.h"

namespace drover::coordinator {

// Upserts, then deletions, applied together in one transaction.
struct StoreBatch {
  std::vector<v1::JobRecord> jobs;
  std::vector<v1::AttemptRecord> attempts;
  std::vector<v1::NodeRecord> nodes;
  std::vector<v1::CheckpointRecord> checkpoints;
  std::map<std::string, int64_t> counters;
  // Jobs to delete with their attempts and checkpoint records. Applied after the upserts,
  // so a batch merged from an older change of the job and its deletion leaves nothing.
  std::vector<std::string> deleted_jobs;

  bool empty() const {
    return jobs.empty() && attempts.empty() && nodes.empty() && checkpoints.empty() &&
           counters.empty() && deleted_jobs.empty();
  }
  void Append(StoreBatch other);
};

// Everything the store holds, as loaded at start-up.
struct StoreContents {
  std::vector<v1::JobRecord> jobs;                // ordered by submit_seq
  std::vector<v1::AttemptRecord> attempts;        // ordered by (job_id, attempt)
  std::vector<v1::NodeRecord> nodes;              // ordered by name
  std::vector<v1::CheckpointRecord> checkpoints;  // ordered by (job_id, step)
  std::map<std::string, int64_t> counters;
};

// Not thread-safe: one owner (the coordinator's store writer) calls it.
class Store {
 public:
  virtual ~Store() = default;

  // Writes every record of `batch` in one transaction. On error (a full disk, a read-only
  // file) nothing of the batch was written, and the store is usable for the next batch.
  virtual Status Apply(const StoreBatch& batch) = 0;

  virtual StatusOr<StoreContents> LoadAll() = 0;
};

}  // namespace drover::coordinator
