#include "coordinator/store/store_writer.h"

#include <spdlog/spdlog.h>

namespace drover::coordinator {

StoreWriter::StoreWriter(SqliteStore* store) : store_(store), thread_([this] { Run(); }) {}

StoreWriter::~StoreWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t StoreWriter::Enqueue(StoreBatch batch) {
  if (batch.empty()) return 0;
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = next_seq_++;
    queue_.emplace_back(seq, std::move(batch));
  }
  cv_.notify_all();
  return seq;
}

Status StoreWriter::WaitDurable(int64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return applied_seq_ >= seq; });
  return first_error_;
}

void StoreWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    // Merge everything queued into one transaction: fewer fsyncs under load, and the
    // order of upserts inside the merged batch keeps the newest record of each key last.
    StoreBatch merged;
    int64_t last = 0;
    while (!queue_.empty()) {
      merged.Append(std::move(queue_.front().second));
      last = queue_.front().first;
      queue_.pop_front();
    }
    lock.unlock();
    Status st = store_->Apply(merged);
    if (!st.ok()) spdlog::error("state store write failed: {}", st.ToString());
    lock.lock();
    if (!st.ok() && first_error_.ok()) first_error_ = st;
    applied_seq_ = last;
    cv_.notify_all();
  }
}

}  // namespace drover::coordinator
