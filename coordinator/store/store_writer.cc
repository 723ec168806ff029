#include "coordinator/store/store_writer.h"

#include <spdlog/spdlog.h>

#include <iterator>

namespace drover::coordinator {
namespace {

Status NotWritten(const Status& stopped) {
  return Status(stopped.code(),
                "not written: the state store takes no more writes after a failed one (" +
                    stopped.message() + ")");
}

}  // namespace

StoreWriter::StoreWriter(Store* store, FatalFn fatal, DurableFn durable)
    : store_(store),
      fatal_(std::move(fatal)),
      durable_(std::move(durable)),
      thread_([this] { Run(); }) {}

StoreWriter::~StoreWriter() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

int64_t StoreWriter::Queue(StoreBatch batch, bool proposal) {
  int64_t seq;
  {
    MutexLock lock(&mu_);
    seq = next_seq_++;
    queue_.push_back(Entry{seq, std::move(batch), proposal});
  }
  cv_.SignalAll();
  return seq;
}

int64_t StoreWriter::Commit(StoreBatch batch) {
  if (batch.empty()) return 0;
  return Queue(std::move(batch), /*proposal=*/false);
}

int64_t StoreWriter::Propose(StoreBatch batch) {
  DROVER_CHECK(!batch.empty());
  return Queue(std::move(batch), /*proposal=*/true);
}

Status StoreWriter::WaitProposal(int64_t seq) {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return applied_seq_ >= seq; });
  auto it = proposal_result_.find(seq);
  DROVER_CHECK_MSG(it != proposal_result_.end(), "WaitProposal: not a proposal, or waited twice");
  Status st = std::move(it->second);
  proposal_result_.erase(it);
  return st;
}

Status StoreWriter::WaitDurable(int64_t seq) {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return applied_seq_ >= seq; });
  return stopped_;
}

std::vector<Status> StoreWriter::Write(std::vector<Entry>& entries) {
  std::vector<Status> out(entries.size());
  if (entries.size() > 1) {
    // Copies, not moves: the batches are needed again if the merged write fails. The order
    // of upserts inside the merged batch keeps the newest record of each key last.
    StoreBatch merged;
    for (const Entry& e : entries) merged.Append(e.batch);
    if (store_->Apply(merged).ok()) return out;
  }
  Status stopped;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!stopped.ok()) {
      out[i] = NotWritten(stopped);
      continue;
    }
    out[i] = store_->Apply(entries[i].batch);
    if (out[i].ok()) continue;
    spdlog::error("state store write failed ({}): {}",
                  entries[i].proposal ? "refused" : "already made in memory", out[i].ToString());
    if (!entries[i].proposal) stopped = out[i];
  }
  return out;
}

void StoreWriter::Run() {
  MutexLock lock(&mu_);
  while (true) {
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    std::vector<Entry> entries(std::make_move_iterator(queue_.begin()),
                               std::make_move_iterator(queue_.end()));
    queue_.clear();
    const Status stopped = stopped_;
    lock.Unlock();
    std::vector<Status> results;
    if (stopped.ok()) {
      results = Write(entries);
    } else {
      results.assign(entries.size(), NotWritten(stopped));
    }
    Status fatal;
    lock.Lock();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].proposal) {
        proposal_result_[entries[i].seq] = results[i];
      } else if (!results[i].ok() && stopped_.ok()) {
        stopped_ = fatal = results[i];
      }
    }
    // The fatal reaction comes before any waiter learns the outcome: nobody answers a
    // client as if the coordinator carried on.
    if (!fatal.ok() && fatal_) {
      lock.Unlock();
      fatal_(fatal);
      lock.Lock();
    }
    // Before the waiters wake: whoever waited for these writes finds their consequences.
    if (durable_ && stopped_.ok()) {
      lock.Unlock();
      durable_(entries.back().seq);
      lock.Lock();
    }
    applied_seq_ = entries.back().seq;
    cv_.SignalAll();
  }
}

}  // namespace drover::coordinator
