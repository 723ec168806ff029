#include "worker/engine/ckpt/agreed_load.h"

#include <spdlog/spdlog.h>

#include <map>
#include <string>
#include <vector>

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
  std::vector<std::string> reasons;
  for (auto it = rejected.rbegin(); it != rejected.rend(); ++it) reasons.push_back(it->second);
  return NoneUsableError(dir, reasons);
}

// A rank's report and rank 0's verdict: empty when the checkpoint is good, else one of these
// tags and the message.
constexpr char kBroken = 'B';   // drop it and try the next one
constexpr char kRefused = 'R';  // every rank returns the message as InvalidArgument

}  // namespace

StatusOr<CheckpointPart> LoadAgreedCheckpoint(const AgreedLoadOptions& o, const PartRequestFn& want,
                                              std::string* path) {
  if (o.world_size <= 1) return LoadLatestCheckpointPart(o.dir, want, path, o.progress);
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
    StatusOr<CheckpointPart> part = ReadCheckpointPart(step_dir, chosen, want, o.progress);
    std::string report;
    if (!part.ok()) {
      const bool broken = part.status().code() == StatusCode::kDataLoss;
      report = std::string(1, broken ? kBroken : kRefused) + std::string(part.status().message());
    }
    RETURN_IF_ERROR(o.store->Set(base + "/r" + std::to_string(o.rank), report));
    std::string verdict;
    if (rank0) {
      for (int r = 0; r < o.world_size && verdict.empty(); ++r) {
        auto got = o.store->Get(base + "/r" + std::to_string(r), o.timeout);
        if (!got.ok())
          return got.status().WithContext("waiting for rank " + std::to_string(r) +
                                          "'s checkpoint read");
        if (got->empty()) continue;
        // A refusal is every rank's (they share the spec): no rank to name.
        const std::string who = got->front() == kBroken ? "rank " + std::to_string(r) + ": " : "";
        verdict = got->front() + who + got->substr(1);
      }
      RETURN_IF_ERROR(o.store->Set(base + "/verdict", verdict));
    } else {
      auto got = o.store->Get(base + "/verdict", o.timeout);
      if (!got.ok()) return got.status().WithContext("waiting for rank 0's checkpoint verdict");
      verdict = *got;
    }
    if (verdict.empty()) {
      if (path != nullptr) *path = step_dir;
      return part;
    }
    if (verdict.front() == kRefused) return InvalidArgumentError(verdict.substr(1));
    if (rank0) {
      spdlog::warn("checkpoint skipped: {}", verdict.substr(1));
      rejected[chosen] = verdict.substr(1);
    }
  }
}

}  // namespace drover::engine::ckpt
