#include "coordinator/store/sqlite_store.h"

#include <sqlite3.h>

#include <filesystem>

namespace drover::coordinator {
namespace {

// Every record table: a text key, a second integer key (0 when unused) and the blob.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs (id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL,
                                 PRIMARY KEY (id));
CREATE TABLE IF NOT EXISTS attempts (job_id TEXT NOT NULL, attempt INTEGER NOT NULL,
                                     data BLOB NOT NULL, PRIMARY KEY (job_id, attempt));
CREATE TABLE IF NOT EXISTS nodes (name TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (name));
CREATE TABLE IF NOT EXISTS checkpoints (job_id TEXT NOT NULL, step INTEGER NOT NULL,
                                        data BLOB NOT NULL, PRIMARY KEY (job_id, step));
CREATE TABLE IF NOT EXISTS counters (name TEXT NOT NULL, value INTEGER NOT NULL,
                                     PRIMARY KEY (name));
)sql";

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  int rc() const { return rc_; }
  sqlite3_stmt* get() { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// Runs one upsert `sql` with (text key, int key, blob) bound as ?1 ?2 ?3.
Status Upsert(sqlite3* db, const char* sql, const std::string& key, int64_t ikey,
              const google::protobuf::MessageLite& msg, const char* what) {
  Stmt st(db, sql);
  if (st.rc() != SQLITE_OK) return SqliteToStatus(st.rc(), db, what);
  std::string blob = msg.SerializeAsString();
  sqlite3_bind_text(st.get(), 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st.get(), 2, ikey);
  sqlite3_bind_blob(st.get(), 3, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  int rc = sqlite3_step(st.get());
  if (rc != SQLITE_DONE) return SqliteToStatus(rc, db, what);
  return OkStatus();
}

// Deletes the job's rows from every table that holds them.
Status DeleteJob(sqlite3* db, const std::string& job_id) {
  for (const char* sql :
       {"DELETE FROM jobs WHERE id = ?1", "DELETE FROM attempts WHERE job_id = ?1",
        "DELETE FROM checkpoints WHERE job_id = ?1"}) {
    Stmt st(db, sql);
    if (st.rc() != SQLITE_OK) return SqliteToStatus(st.rc(), db, "deleting job");
    sqlite3_bind_text(st.get(), 1, job_id.data(), static_cast<int>(job_id.size()),
                      SQLITE_TRANSIENT);
    int rc = sqlite3_step(st.get());
    if (rc != SQLITE_DONE) return SqliteToStatus(rc, db, "deleting job");
  }
  return OkStatus();
}

template <typename Msg>
Status LoadTable(sqlite3* db, const char* sql, const char* what, std::vector<Msg>* out) {
  Stmt st(db, sql);
  if (st.rc() != SQLITE_OK) return SqliteToStatus(st.rc(), db, what);
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    const void* data = sqlite3_column_blob(st.get(), 0);
    int size = sqlite3_column_bytes(st.get(), 0);
    Msg msg;
    if (!msg.ParseFromArray(data, size)) {
      return DataLossError(std::string("state store: unparsable row in ") + what);
    }
    out->push_back(std::move(msg));
  }
  if (rc != SQLITE_DONE) return SqliteToStatus(rc, db, what);
  return OkStatus();
}

}  // namespace

Status SqliteToStatus(int rc, sqlite3* db, const std::string& context) {
  if (rc == SQLITE_OK || rc == SQLITE_DONE || rc == SQLITE_ROW) return OkStatus();
  std::string msg = context + ": sqlite: " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return UnavailableError(msg);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_IOERR:
      return DataLossError(msg);
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return ResourceExhaustedError(msg);
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return FailedPreconditionError(msg);
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
      return InvalidArgumentError(msg);
    default:
      return InternalError(msg);
  }
}

StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path) {
  // SQLite opens an empty file as an empty database; for a coordinator that would be a
  // silent start with no jobs where state existed (a truncated copy, a failed restore).
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && std::filesystem::file_size(path, ec) == 0 && !ec) {
    return DataLossError("state store " + path +
                         " is empty (0 bytes): refusing to start without the state it should "
                         "hold; restore it, or move it away to start with no jobs");
  }
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    Status st = SqliteToStatus(rc, db, "opening state store " + path);
    sqlite3_close(db);
    return st;
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db));
  sqlite3_busy_timeout(db, 5000);
  // WAL: readers never block the writer, and a commit is one append to the log.
  // synchronous=FULL: a committed transition survives a power cut, not only a crash.
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL;"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL;"));
  RETURN_IF_ERROR(store->Exec(kSchema));
  return store;
}

SqliteStore::~SqliteStore() { sqlite3_close(db_); }

Status SqliteStore::Exec(const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  sqlite3_free(err);
  return SqliteToStatus(rc, db_, "state store");
}

Status SqliteStore::Apply(const StoreBatch& batch) {
  if (batch.empty()) return OkStatus();
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE;"));
  Status st = [&]() -> Status {
    for (const auto& j : batch.jobs) {
      RETURN_IF_ERROR(Upsert(db_, "INSERT OR REPLACE INTO jobs (id, seq, data) VALUES (?1,?2,?3)",
                             j.job_id(), j.submit_seq(), j, "writing job"));
    }
    for (const auto& a : batch.attempts) {
      RETURN_IF_ERROR(
          Upsert(db_, "INSERT OR REPLACE INTO attempts (job_id, attempt, data) VALUES (?1,?2,?3)",
                 a.job_id(), a.attempt(), a, "writing attempt"));
    }
    for (const auto& n : batch.nodes) {
      RETURN_IF_ERROR(Upsert(db_, "INSERT OR REPLACE INTO nodes (name, data) VALUES (?1,?3)",
                             n.name(), 0, n, "writing node"));
    }
    for (const auto& c : batch.checkpoints) {
      RETURN_IF_ERROR(
          Upsert(db_, "INSERT OR REPLACE INTO checkpoints (job_id, step, data) VALUES (?1,?2,?3)",
                 c.job_id(), c.step(), c, "writing checkpoint"));
    }
    for (const auto& [name, value] : batch.counters) {
      Stmt st(db_, "INSERT OR REPLACE INTO counters (name, value) VALUES (?1, ?2)");
      if (st.rc() != SQLITE_OK) return SqliteToStatus(st.rc(), db_, "writing counter");
      sqlite3_bind_text(st.get(), 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
      sqlite3_bind_int64(st.get(), 2, value);
      int rc = sqlite3_step(st.get());
      if (rc != SQLITE_DONE) return SqliteToStatus(rc, db_, "writing counter");
    }
    for (const auto& id : batch.deleted_jobs) RETURN_IF_ERROR(DeleteJob(db_, id));
    return OkStatus();
  }();
  if (st.ok()) st = Exec("COMMIT;");
  // In WAL mode the pages reach the disk at COMMIT, so that is where a full disk shows.
  // SQLite rolls some failed COMMITs back by itself and leaves others open (its docs advise
  // an explicit ROLLBACK); one left open would make every later BEGIN fail, so the next
  // batch, once there is room, could never be written.
  if (!st.ok() && !sqlite3_get_autocommit(db_)) (void)Exec("ROLLBACK;");
  return st;
}

StatusOr<StoreContents> SqliteStore::LoadAll() {
  StoreContents c;
  RETURN_IF_ERROR(LoadTable(db_, "SELECT data FROM jobs ORDER BY seq", "jobs", &c.jobs));
  RETURN_IF_ERROR(LoadTable(db_, "SELECT data FROM attempts ORDER BY job_id, attempt", "attempts",
                            &c.attempts));
  RETURN_IF_ERROR(LoadTable(db_, "SELECT data FROM nodes ORDER BY name", "nodes", &c.nodes));
  RETURN_IF_ERROR(LoadTable(db_, "SELECT data FROM checkpoints ORDER BY job_id, step",
                            "checkpoints", &c.checkpoints));
  Stmt st(db_, "SELECT name, value FROM counters");
  if (st.rc() != SQLITE_OK) return SqliteToStatus(st.rc(), db_, "counters");
  int rc;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    const char* name = reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 0));
    c.counters[name ? name : ""] = sqlite3_column_int64(st.get(), 1);
  }
  if (rc != SQLITE_DONE) return SqliteToStatus(rc, db_, "counters");
  return c;
}

}  // namespace drover::coordinator
