// The coordinator's durable state: SQLite in WAL mode, one file <state-dir>/state.db.
//
// Every table holds serialized protobuf records keyed by their identity, so the schema
// never changes when a record grows a field. A state transition is one StoreBatch, written
// in one transaction: after a crash the store holds either all of a batch or none of it.
//
// Heartbeats never reach this class (heartbeat times live in memory only); callers write
// on registration and state changes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/drover.pb.h"

struct sqlite3;

namespace drover::coordinator {

// Upserts applied together in one transaction.
struct StoreBatch {
  std::vector<v1::JobRecord> jobs;
  std::vector<v1::AttemptRecord> attempts;
  std::vector<v1::NodeRecord> nodes;
  std::vector<v1::CheckpointRecord> checkpoints;
  std::map<std::string, int64_t> counters;

  bool empty() const {
    return jobs.empty() && attempts.empty() && nodes.empty() && checkpoints.empty() &&
           counters.empty();
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
class SqliteStore {
 public:
  // Opens (creating when missing) `path`; ":memory:" gives a private in-memory database.
  static StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path);
  ~SqliteStore();
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Writes every record of `batch` in one transaction (all or nothing).
  Status Apply(const StoreBatch& batch);

  StatusOr<StoreContents> LoadAll();

 private:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  Status Exec(const char* sql);

  sqlite3* db_;
};

// Translates a SQLite result code at the boundary (the one place that knows them).
Status SqliteToStatus(int rc, sqlite3* db, const std::string& context);

}  // namespace drover::coordinator
