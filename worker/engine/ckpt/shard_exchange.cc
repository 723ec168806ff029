#include "worker/engine/ckpt/shard_exchange.h"

#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <thread>

namespace drover::engine::ckpt {
namespace {

// "ok\n" + the entries as a manifest's JSON, or "error\n" + the reason.
constexpr char kOk[] = "ok\n";
constexpr char kError[] = "error\n";

// MarkStore's mark: set once by rank 0, gone only when the store lost its keys.
constexpr char kMarkKey[] = "ckpt/mark";

std::string KeyOf(int64_t step, int rank) {
  return "ckpt/" + std::to_string(step) + "/" + std::to_string(rank);
}

}  // namespace

KvShardExchange::KvShardExchange(parallel::KvStore* store, std::chrono::milliseconds timeout,
                                 const std::atomic<bool>* stop,
                                 std::chrono::milliseconds after_restart)
    : store_(store), timeout_(timeout), stop_(stop), after_restart_(after_restart) {}

bool KvShardExchange::Stopped() const { return stop_ != nullptr && stop_->load(); }

Status KvShardExchange::MarkStore() {
  Status st = store_->Set(kMarkKey, "1");
  if (st.ok()) marked_ = true;
  return st;
}

bool KvShardExchange::StoreRestarted() {
  if (!marked_) return false;
  StatusOr<std::string> mark = store_->Get(kMarkKey, std::chrono::milliseconds(0));
  // Unavailable, or any other error: not known to be gone.
  if (mark.ok() || (mark.status().code() != StatusCode::kDeadlineExceeded &&
                    mark.status().code() != StatusCode::kNotFound)) {
    return false;
  }
  marked_ = false;
  return true;
}

Status KvShardExchange::Publish(int64_t step, int rank,
                                const StatusOr<std::vector<v1::CheckpointShard>>& result) {
  std::string value;
  if (!result.ok()) {
    value = kError + result.status().ToString();
  } else {
    v1::CheckpointManifest entries;
    for (const auto& sh : *result) *entries.add_shards() = sh;
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(entries, &json).ok()) {
      return InternalError("cannot encode checkpoint shard entries");
    }
    value = kOk + json;
  }
  // The store is the coordinator's rendezvous service: Unavailable while it restarts. A
  // report lost then would leave rank 0 waiting for it until its timeout, with no
  // checkpoint committed meanwhile, so it is sent again until the same timeout.
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout_;
  std::chrono::milliseconds backoff(50);
  while (true) {
    Status set = store_->Set(KeyOf(step, rank), value);
    Heard(set.code());
    if (set.code() != StatusCode::kUnavailable || Clock::now() >= deadline || Stopped()) {
      Heard(StatusCode::kOk);
      return set;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min<std::chrono::milliseconds>(2 * backoff, std::chrono::seconds(1));
  }
}

StatusOr<std::vector<v1::CheckpointShard>> KvShardExchange::Collect(int64_t step, int world_size) {
  StatusOr<std::vector<v1::CheckpointShard>> out = CollectAll(step, world_size);
  Heard(StatusCode::kOk);
  return out;
}

StatusOr<std::vector<v1::CheckpointShard>> KvShardExchange::CollectAll(int64_t step,
                                                                       int world_size) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + timeout_;
  // Waits in short slices so that a stop request (the job is being recovered) ends the wait.
  constexpr auto kSlice = std::chrono::milliseconds(200);
  if (!marked_) (void)MarkStore();
  bool restarted = false;
  std::vector<v1::CheckpointShard> out;
  for (int r = 1; r < world_size; ++r) {
    StatusOr<std::string> got = DeadlineExceededError("");
    while (true) {
      if (Stopped()) {
        return CancelledError("stopped while waiting for the checkpoint shards of step " +
                              std::to_string(step));
      }
      got = store_->Get(KeyOf(step, r), kSlice);
      // Unavailable: the coordinator is restarting; the report may come once it is back.
      const StatusCode code = got.status().code();
      Heard(code);
      if (got.ok() || (code != StatusCode::kDeadlineExceeded && code != StatusCode::kUnavailable)) {
        break;
      }
      if (code == StatusCode::kUnavailable) std::this_thread::sleep_for(kSlice);
      // A report made to the store before it restarted is gone: only reports made since can
      // still come, from ranks that were still writing or still trying to reach it.
      if (!restarted && StoreRestarted()) {
        restarted = true;
        deadline = std::min(deadline, Clock::now() + after_restart_);
        spdlog::warn(
            "the coordinator restarted while rank 0 waited for the checkpoint shards of step "
            "{}: reports made before are lost, so the shards not reported within {} s are "
            "given up with this checkpoint",
            step, after_restart_.count() / 1000.0);
        (void)MarkStore();
      }
      if (Clock::now() >= deadline) {
        if (code == StatusCode::kUnavailable) {
          return got.status().WithContext("checkpoint shards of step " + std::to_string(step));
        }
        if (restarted) {
          return UnavailableError(
              "rank " + std::to_string(r) + "'s report of its checkpoint " + "shard of step " +
              std::to_string(step) + " was lost when the coordinator restarted (none came within " +
              fmt::format("{}", after_restart_.count() / 1000.0) + " s of finding it restarted)");
        }
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
