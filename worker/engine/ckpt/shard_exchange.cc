#include "worker/engine/ckpt/shard_exchange.h"

#include <google/protobuf/util/json_util.h>

#include <string>

namespace drover::engine::ckpt {
namespace {

// "ok\n" + the entries as a manifest's JSON, or "error\n" + the reason.
constexpr char kOk[] = "ok\n";
constexpr char kError[] = "error\n";

std::string KeyOf(int64_t step, int rank) {
  return "ckpt/" + std::to_string(step) + "/" + std::to_string(rank);
}

}  // namespace

KvShardExchange::KvShardExchange(parallel::KvStore* store, std::chrono::milliseconds timeout,
                                 const std::atomic<bool>* stop)
    : store_(store), timeout_(timeout), stop_(stop) {}

Status KvShardExchange::Publish(int64_t step, int rank,
                                const StatusOr<std::vector<v1::CheckpointShard>>& result) {
  if (!result.ok()) return store_->Set(KeyOf(step, rank), kError + result.status().ToString());
  v1::CheckpointManifest entries;
  for (const auto& sh : *result) *entries.add_shards() = sh;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(entries, &json).ok()) {
    return InternalError("cannot encode checkpoint shard entries");
  }
  return store_->Set(KeyOf(step, rank), kOk + json);
}

StatusOr<std::vector<v1::CheckpointShard>> KvShardExchange::Collect(int64_t step, int world_size) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout_;
  // Waits in short slices so that a stop request (the job is being recovered) ends the wait.
  constexpr auto kSlice = std::chrono::milliseconds(200);
  std::vector<v1::CheckpointShard> out;
  for (int r = 1; r < world_size; ++r) {
    StatusOr<std::string> got = DeadlineExceededError("");
    while (true) {
      if (stop_ != nullptr && stop_->load()) {
        return CancelledError("stopped while waiting for the checkpoint shards of step " +
                              std::to_string(step));
      }
      got = store_->Get(KeyOf(step, r), kSlice);
      if (got.ok() || got.status().code() != StatusCode::kDeadlineExceeded) break;
      if (Clock::now() >= deadline) {
        return DeadlineExceededError(
            "rank " + std::to_string(r) + " did not report its checkpoint shard of step " +
            std::to_string(step) + " within " + std::to_string(timeout_.count() / 1000) + " s");
      }
    }
    if (!got.ok())
      return got.status().WithContext("checkpoint shards of step " + std::to_string(step));
    const std::string& value = *got;
    if (value.rfind(kError, 0) == 0) {
      return UnavailableError("rank " + std::to_string(r) +
                              " could not write its shard: " + value.substr(sizeof(kError) - 1));
    }
    v1::CheckpointManifest entries;
    if (value.rfind(kOk, 0) != 0 ||
        !google::protobuf::util::JsonStringToMessage(value.substr(sizeof(kOk) - 1), &entries)
             .ok()) {
      return InternalError("rank " + std::to_string(r) + " reported unreadable shard entries");
    }
    out.insert(out.end(), entries.shards().begin(), entries.shards().end());
  }
  return out;
}

}  // namespace drover::engine::ckpt
