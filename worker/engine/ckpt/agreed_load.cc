#include "worker/engine/ckpt/agreed_load.h"

#include <spdlog/spdlog.h>

#include <map>

namespace drover::engine::ckpt {
namespace {

constexpr int64_t kNone = -1;      // no checkpoint at all
constexpr int64_t kUnusable = -2;  // some exist, none usable

// Rank 0: the newest checkpoint not rejected that passes the shape check; every one skipped
// on the way is added to `rejected` with its reason.
int64_t Choose(const std::string& dir, std::map<int64_t, std::string>* rejected) {
  const auto all = ListCheckpoints(dir);
  if (all.empty()) return kNone;
  for (const auto& [step, step_dir] : all) {
    if (rejected->count(step)) continue;
    Status st = CheckCheckpointShape(step_dir, step);
    if (st.ok()) return step;
    spdlog::warn("checkpoint skipped: {}", st.message());
    (*rejected)[step] = std::string(st.message());
  }
  return kUnusable;
}

Status Unusable(const std::string& dir, const std::map<int64_t, std::string>& rejected) {
  std::string why;
  for (auto it = rejected.rbegin(); it != rejected.rend(); ++it) why += "\n  " + it->second;
  return FailedPreconditionError(
      "checkpoints exist in " + dir + " but none is usable:" + why +
      "\nmove them away (or use another checkpoint.dir) to start from scratch, or pass "
      "`drover train --fresh`");
}

}  // namespace

StatusOr<CheckpointSnapshot> LoadAgreedCheckpoint(const AgreedLoadOptions& o, std::string* path) {
  if (o.world_size <= 1) return LoadLatestCheckpoint(o.dir, path);
  DROVER_CHECK(o.store != nullptr);
  const bool rank0 = o.rank == 0;
  std::map<int64_t, std::string> rejected;  // rank 0's
  for (int round = 0;; ++round) {
    const std::string base = o.key + "/" + std::to_string(round);
    int64_t chosen;
    if (rank0) {
      chosen = Choose(o.dir, &rejected);
      RETURN_IF_ERROR(o.store->Set(base, std::to_string(chosen)));
    } else {
      auto got = o.store->Get(base, o.timeout);
      if (!got.ok()) return got.status().WithContext("waiting for rank 0's checkpoint choice");
      chosen = std::stoll(*got);
    }
    if (chosen == kNone) return NotFoundError("no checkpoint in " + o.dir);
    if (chosen == kUnusable) {
      if (rank0) return Unusable(o.dir, rejected);
      return FailedPreconditionError("rank 0 found no usable checkpoint in " + o.dir);
    }
    const std::string step_dir = o.dir + "/" + StepDirName(chosen);
    StatusOr<CheckpointSnapshot> snap = VerifyCheckpoint(step_dir, chosen);
    RETURN_IF_ERROR(o.store->Set(base + "/r" + std::to_string(o.rank),
                                 snap.ok() ? "" : std::string(snap.status().message())));
    std::string verdict;
    if (rank0) {
      for (int r = 0; r < o.world_size && verdict.empty(); ++r) {
        auto report = o.store->Get(base + "/r" + std::to_string(r), o.timeout);
        if (!report.ok())
          return report.status().WithContext("waiting for rank " + std::to_string(r) +
                                             "'s checkpoint read");
        if (!report->empty()) verdict = "rank " + std::to_string(r) + ": " + *report;
      }
      RETURN_IF_ERROR(o.store->Set(base + "/verdict", verdict));
    } else {
      auto got = o.store->Get(base + "/verdict", o.timeout);
      if (!got.ok()) return got.status().WithContext("waiting for rank 0's checkpoint verdict");
      verdict = *got;
    }
    if (verdict.empty()) {
      if (path != nullptr) *path = step_dir;
      return snap;
    }
    if (rank0) {
      spdlog::warn("checkpoint skipped: {}", verdict);
      rejected[chosen] = verdict;
    }
  }
}

}  // namespace drover::engine::ckpt
