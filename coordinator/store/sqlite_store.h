// The coordinator's durable state (store.h): SQLite in WAL mode, one file
// <state-dir>/state.db.
//
// Every table holds serialized protobuf records keyed by their identity, so the schema
// never changes when a record grows a field. A state transition is one StoreBatch, written
// in one transaction: after a crash the store holds either all of a batch or none of it.
//
// Heartbeats never reach this class (heartbeat times live in memory only); callers write
// on registration and state changes.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "coordinator/store/store.h"

struct sqlite3;

namespace drover::coordinator {

// Not thread-safe: one owner (the coordinator's store writer) calls it.
class SqliteStore final : public Store {
 public:
  // Opens (creating when missing) `path`; ":memory:" gives a private in-memory database.
  static StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path);
  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  // Writes every record of `batch` in one transaction (all or nothing).
  Status Apply(const StoreBatch& batch) override;

  StatusOr<StoreContents> LoadAll() override;

 private:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  Status Exec(const char* sql);

  sqlite3* db_;
};

// Translates a SQLite result code at the boundary (the one place that knows them).
Status SqliteToStatus(int rc, sqlite3* db, const std::string& context);

}  // namespace drover::coordinator
