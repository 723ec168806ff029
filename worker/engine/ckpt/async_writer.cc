#include "worker/engine/ckpt/async_writer.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace drover::engine::ckpt {

AsyncCheckpointWriter::AsyncCheckpointWriter(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  {
    MutexLock lock(&mu_);
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return !pending_.has_value() && !busy_; });
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

Status AsyncCheckpointWriter::Submit(ShardSnapshot snap, bool may_give_up) {
  MutexLock lock(&mu_);
  // Woken by the writer when a write ends; the coordinator's absence, which nothing
  // signals, is polled.
  constexpr auto kPoll = std::chrono::milliseconds(50);
  while (pending_.has_value() || busy_) {
    if (may_give_up && !pending_.has_value() && WaitingOnCoordinator()) {
      const int64_t step = snap.meta.step();
      Status why = UnavailableError(
          "rank " + std::to_string(options_.rank) + " gave its part up: its checkpoint of step " +
          std::to_string(busy_step_) +
          " was still waiting on the coordinator, which could not be reached, and training "
          "does not wait for it");
      spdlog::warn("checkpoint of step {}: {}", step, why.message());
      snap.shard = RankShard{};
      // submitted_ stays the waiting write's: InFlightFor keeps saying how late it is.
      pending_ = Pending{std::move(snap), std::move(why)};
      cv_.SignalAll();
      return OkStatus();
    }
    if (may_give_up) {
      cv_.WaitFor(&mu_, kPoll);
    } else {
      cv_.Wait(&mu_);
    }
  }
  Status previous = std::exchange(last_error_, OkStatus());
  pending_ = Pending{std::move(snap), OkStatus()};
  submitted_ = std::chrono::steady_clock::now();
  cv_.SignalAll();
  return previous;
}

bool AsyncCheckpointWriter::WaitingOnCoordinator() const {
  return fence_unreachable_.load(std::memory_order_relaxed) ||
         (options_.exchange != nullptr && options_.exchange->Unreachable());
}

Status AsyncCheckpointWriter::WriteNow(ShardSnapshot snap) {
  Status previous = Flush();
  Status st = Save(snap, OkStatus());
  MutexLock lock(&mu_);
  recycled_ = std::move(snap.shard);
  return st.ok() ? previous : st;
}

std::optional<std::chrono::milliseconds> AsyncCheckpointWriter::InFlightFor() {
  MutexLock lock(&mu_);
  if (!pending_.has_value() && !busy_) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               submitted_);
}

RankShard AsyncCheckpointWriter::TakeRecycled() {
  MutexLock lock(&mu_);
  return std::exchange(recycled_, RankShard{});
}

Status AsyncCheckpointWriter::Flush() {
  MutexLock lock(&mu_);
  cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return !pending_.has_value() && !busy_; });
  return std::exchange(last_error_, OkStatus());
}

void AsyncCheckpointWriter::Loop() {
  MutexLock lock(&mu_);
  while (true) {
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || pending_.has_value(); });
    if (!pending_.has_value()) return;  // stop_ and nothing left
    Pending next = std::move(*pending_);
    pending_.reset();
    busy_ = true;
    busy_step_ = next.snap.meta.step();
    lock.Unlock();
    Status st = Save(next.snap, next.given_up);
    lock.Lock();
    if (next.given_up.ok()) recycled_ = std::move(next.snap.shard);
    busy_ = false;
    if (!st.ok()) last_error_ = st;
    cv_.SignalAll();
  }
}

Status AsyncCheckpointWriter::Fail(int64_t step, Status st) {
  spdlog::error("checkpoint of step {} failed: {}", step, st.ToString());
  if (options_.on_failure) options_.on_failure(step, st);
  return st;
}

Status AsyncCheckpointWriter::Save(const ShardSnapshot& snap, const Status& given_up) {
  const int64_t step = snap.meta.step();
  StatusOr<std::vector<v1::CheckpointShard>> mine =
      given_up.ok() ? WriteShard(options_.dir, snap.meta, snap.shard, options_.fs,
                                 [&](int64_t written, int64_t total) {
                                   if (options_.on_progress)
                                     options_.on_progress(step, written, total);
                                 })
                    : StatusOr<std::vector<v1::CheckpointShard>>(given_up);
  if (options_.rank != 0) {
    Status published = options_.exchange->Publish(step, options_.rank, mine);
    if (!mine.ok()) return Fail(step, mine.status());
    if (!published.ok()) return Fail(step, published.WithContext("reporting the shard"));
    return OkStatus();
  }
  Status st = mine.status();
  std::vector<v1::CheckpointShard> shards;
  if (mine.ok()) shards = std::move(mine).value();
  if (options_.world_size > 1) {
    // Even when this rank failed: the tmp directory is removed only once no rank writes.
    auto others = options_.exchange->Collect(step, options_.world_size);
    if (others.ok()) {
      shards.insert(shards.end(), others->begin(), others->end());
    } else if (st.ok()) {
      st = others.status();
    }
  }
  if (!st.ok()) {
    AbandonCheckpoint(options_.dir, snap.meta, options_.fs);
    return Fail(step, st);
  }
  // A superseded attempt must never publish where the current one does, nor prune its
  // checkpoints: the commit and the pruning wait for the fence.
  if (Status fenced =
          ConfirmWithin(options_.fence, options_.fence_timeout, options_.stop, &fence_unreachable_);
      !fenced.ok()) {
    AbandonCheckpoint(options_.dir, snap.meta, options_.fs);
    return Fail(
        step, fenced.WithContext("checkpoint of step " + std::to_string(step) + " not published"));
  }
  auto path = CommitCheckpoint(options_.dir, snap.meta, shards, options_.fs);
  if (!path.ok()) return Fail(step, path.status());
  Status pruned = PruneCheckpoints(options_.dir, options_.keep_last, options_.fs);
  if (!pruned.ok()) spdlog::warn("checkpoint pruning: {}", pruned.ToString());
  if (options_.on_complete) options_.on_complete(snap.meta, *path);
  return OkStatus();
}

}  // namespace drover::engine::ckpt
