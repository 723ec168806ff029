#include "worker/engine/ckpt/async_writer.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace drover::engine::ckpt {

AsyncCheckpointWriter::AsyncCheckpointWriter(std::string dir, int keep_last, OnComplete on_complete,
                                             OnFailure on_failure)
    : dir_(std::move(dir)),
      keep_last_(keep_last),
      on_complete_(std::move(on_complete)),
      on_failure_(std::move(on_failure)) {
  thread_ = std::thread([this] { Loop(); });
}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !pending_.has_value() && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status AsyncCheckpointWriter::Submit(CheckpointSnapshot snap) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !pending_.has_value() && !busy_; });
  Status previous = std::exchange(last_error_, OkStatus());
  pending_ = std::move(snap);
  cv_.notify_all();
  return previous;
}

Status AsyncCheckpointWriter::WriteNow(const CheckpointSnapshot& snap) {
  Status previous = Flush();
  Status st = WriteAndPrune(snap);
  return st.ok() ? previous : st;
}

Status AsyncCheckpointWriter::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !pending_.has_value() && !busy_; });
  return std::exchange(last_error_, OkStatus());
}

void AsyncCheckpointWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
    if (!pending_.has_value()) return;  // stop_ and nothing left
    CheckpointSnapshot snap = std::move(*pending_);
    pending_.reset();
    busy_ = true;
    lock.unlock();
    Status st = WriteAndPrune(snap);
    lock.lock();
    busy_ = false;
    if (!st.ok()) last_error_ = st;
    cv_.notify_all();
  }
}

Status AsyncCheckpointWriter::WriteAndPrune(const CheckpointSnapshot& snap) {
  auto path = WriteCheckpoint(dir_, snap);
  if (!path.ok()) {
    spdlog::error("checkpoint of step {} failed: {}", snap.meta.step(), path.status().ToString());
    if (on_failure_) on_failure_(snap.meta.step(), path.status());
    return path.status();
  }
  Status pruned = PruneCheckpoints(dir_, keep_last_);
  if (!pruned.ok()) spdlog::warn("checkpoint pruning: {}", pruned.ToString());
  if (on_complete_) on_complete_(snap.meta, *path);
  return OkStatus();
}

}  // namespace drover::engine::ckpt
