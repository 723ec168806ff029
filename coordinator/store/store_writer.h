// Writes StoreBatches to the Store on its own thread, in the order they were queued, so
// that the coordinator never holds its state lock across disk I/O.
//
// Memory and disk must never disagree, so a batch is one of two kinds, by what its caller
// did before queueing it (the caller queues while holding its own lock, so queue order is
// the order of the transitions):
//
//  - Commit: a transition already made in memory, one the coordinator cannot refuse (a
//    trainer exited, a node died, a placement the scheduler made). If its write fails,
//    memory is ahead of disk for good: the writer calls `fatal` once, with the error, and
//    from then on writes nothing (a later batch could build on the lost one). The
//    coordinator fail-stops; a restart from disk is consistent again.
//  - Propose: a transition not made yet (SubmitJob, CancelJob). Its caller waits for the
//    outcome, without its lock, and makes the transition in memory only once it is durable;
//    a failed write refuses it and nothing changed. The writer goes on.
//
// Batches queued together are written in one transaction (fewer fsyncs under load). When
// that transaction fails, each batch is written again on its own, so that an error lands on
// the batch that caused it: a submit refused for a full disk does not take down a small
// transition written with it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "coordinator/store/store.h"

namespace drover::coordinator {

class StoreWriter {
 public:
  using FatalFn = std::function<void(const Status& error)>;
  using DurableFn = std::function<void(int64_t seq)>;

  // `store` must outlive this writer. `fatal` runs at most once, on the writer's thread,
  // without the writer's lock held. `durable` (optional) runs on the writer's thread,
  // without its lock, after each write that left every commit up to `seq` durable. Starts
  // the writer thread.
  StoreWriter(Store* store, FatalFn fatal, DurableFn durable = nullptr);
  // Writes everything still queued (unless a commit failed), then stops the thread.
  ~StoreWriter();

  // Thread-safe. Queues a transition already made in memory; returns its sequence number
  // (0 for an empty batch).
  int64_t Commit(StoreBatch batch);

  // Thread-safe. Queues a transition the caller makes only if WaitProposal(seq) is OK.
  int64_t Propose(StoreBatch batch);
  // Thread-safe. Blocks until proposal `seq` was written or refused; returns its outcome.
  // Call exactly once per Propose.
  Status WaitProposal(int64_t seq);

  // Thread-safe. Blocks until every batch up to `seq` was written; OK when every commit
  // among them is durable, else the error that stopped the writer (refused proposals
  // changed nothing and do not count).
  Status WaitDurable(int64_t seq);

 private:
  struct Entry {
    int64_t seq = 0;
    StoreBatch batch;
    bool proposal = false;
  };
  int64_t Queue(StoreBatch batch, bool proposal);
  void Run();
  // Writes `entries` (merged when it can); returns each one's outcome. After a failed
  // commit nothing more is written: the rest get `stopped` errors.
  std::vector<Status> Write(std::vector<Entry>& entries);

  Store* const store_;
  const FatalFn fatal_;
  const DurableFn durable_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Entry> queue_ GUARDED_BY(mu_);
  int64_t next_seq_ GUARDED_BY(mu_) = 1;
  int64_t applied_seq_ GUARDED_BY(mu_) = 0;
  std::map<int64_t, Status> proposal_result_ GUARDED_BY(mu_);  // until WaitProposal takes it
  Status stopped_ GUARDED_BY(mu_);                             // the commit error, once one
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace drover::coordinator
