// Checkpoint directories (DESIGN.md "Checkpoints"), single-process writer for now, in the
// general sharded format.
//
// Layout: <dir>/step_N/manifest.json (a drover.v1.CheckpointManifest as JSON) plus shard
// files, each holding one element range [begin, end) of one GLOBAL flat arena ("params",
// "adam_m", "adam_v") as little-endian fp32 with a CRC32C in the manifest. Because shards
// are ranges of the global arenas, a later resharding loader can read them at any world size.
//
// Durability protocol: everything is written into step_N.tmp/, every file is fsynced, the
// manifest is written last, the directory is fsynced and only then renamed to step_N/ (and
// the parent fsynced). A step_N/ directory is therefore complete unless the storage lies;
// a crash leaves at most a step_N.tmp/, which readers ignore and pruning removes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/drover.pb.h"

namespace drover::engine::ckpt {

inline constexpr int kManifestFormatVersion = 1;
inline constexpr char kManifestFile[] = "manifest.json";

// Everything one checkpoint holds, in host memory. `meta` carries every manifest field
// except `shards`, which the writer fills in (and the reader fills from disk).
struct CheckpointSnapshot {
  v1::CheckpointManifest meta;
  std::vector<float> params;  // (num_params,)
  std::vector<float> adam_m;  // (num_params,)
  std::vector<float> adam_v;  // (num_params,)
};

// "step_<step>" inside `dir`.
std::string StepDirName(int64_t step);

// Writes `snap` as <dir>/step_<meta.step>/ with the protocol above; creates `dir` if needed.
// An existing complete step_N/ of the same step is replaced. Returns the final directory.
// Thread-compatible: one writer per `dir` at a time.
StatusOr<std::string> WriteCheckpoint(const std::string& dir, const CheckpointSnapshot& snap);

// The manifest of step_N/ (parsed, format version checked; shards not read).
StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir);

// Reads step_N/ and verifies it (holding a shared lock on it that pruning respects): the manifest
// parses, the format version is known, every arena is covered exactly by its shards, every file has
// its recorded size and CRC32C. DataLoss names the first problem found.
StatusOr<CheckpointSnapshot> ReadCheckpoint(const std::string& step_dir);

// Complete step_N/ directories in `dir` (never *.tmp), as (step, path), newest first.
// A missing `dir` is an empty list.
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir);

// ReadCheckpoint, and the manifest's step must be the directory's `step`.
StatusOr<CheckpointSnapshot> VerifyCheckpoint(const std::string& step_dir, int64_t step);

// The newest checkpoint in `dir` that VerifyCheckpoint accepts; every newer one that fails
// is logged with the reason and skipped. NotFound when `dir` holds no step_N/ at all;
// FailedPrecondition naming each one and why when some exist and none is usable (the caller
// must not start from scratch over them). `path` (optional) receives the chosen directory.
StatusOr<CheckpointSnapshot> LoadLatestCheckpoint(const std::string& dir,
                                                  std::string* path = nullptr);

// Deletes all but the newest `keep_last` complete checkpoints (keep_last <= 0 keeps all),
// except any being read (ReadCheckpoint's lock, in any process), and every leftover
// step_N.tmp/ older than the newest complete one.
Status PruneCheckpoints(const std::string& dir, int keep_last);

}  // namespace drover::engine::ckpt
