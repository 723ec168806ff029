// Writes StoreBatches to the SqliteStore on its own thread, in the order they were queued,
// so that the coordinator never holds its state lock across disk I/O.
//
// Callers queue a batch while holding their own lock (cheap: a move into a deque) and get a
// sequence number; an RPC that must not answer before its change is durable (SubmitJob,
// CancelJob) then waits for that number without any lock held.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "coordinator/store/sqlite_store.h"

namespace drover::coordinator {

class StoreWriter {
 public:
  // `store` must outlive this writer. Starts the writer thread.
  explicit StoreWriter(SqliteStore* store);
  // Writes everything still queued, then stops the thread.
  ~StoreWriter();

  // Thread-safe. Queues `batch`; returns its sequence number (0 for an empty batch).
  int64_t Enqueue(StoreBatch batch);

  // Thread-safe. Blocks until every batch up to `seq` was applied; returns the first
  // write error seen (a failed write is logged and also sticks here).
  Status WaitDurable(int64_t seq);

 private:
  void Run();

  SqliteStore* const store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, StoreBatch>> queue_;  // GUARDED_BY(mu_)
  int64_t next_seq_ = 1;                              // GUARDED_BY(mu_)
  int64_t applied_seq_ = 0;                           // GUARDED_BY(mu_)
  Status first_error_;                                // GUARDED_BY(mu_)
  bool stop_ = false;                                 // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace drover::coordinator
