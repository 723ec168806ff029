// Checkpoint directories (DESIGN.md "Checkpoints"), written by every rank of a job.
//
// Layout: <dir>/step_N/manifest.json (a drover.v1.CheckpointManifest as JSON) plus shard
// files <arena>.r<rank>.bin, each holding elements of one GLOBAL flat arena ("params",
// "adam_m", "adam_v") as little-endian fp32 with a CRC32C in the manifest, of the whole
// file and of each 1 MiB block of it (a reader verifies what it reads). Which elements
// is a list of strided runs (a tensor-parallel part of a matrix is one run), so the shards
// of any mesh are ranges of the global arenas and a checkpoint loads at any world size and
// layout with no conversion step.
//
// Durability protocol: every rank writes its shard files into step_N.a<attempt>.tmp/ and
// fsyncs them (WriteShard), then tells rank 0 (ShardExchange); rank 0, once every shard is
// durable, writes the manifest last, checks that the shards tile every arena, fsyncs the
// directory and only then renames it to step_N/ (and fsyncs the parent) (CommitCheckpoint).
// A step_N/ directory is therefore complete unless the storage lies; a crash at any moment
// leaves at most a *.tmp/, which readers ignore and pruning removes. The tmp directory
// carries the attempt so that two attempts never write into one.
//
// The writers take the FileSystem to write through (the real one by default), so that tests
// can fail or crash a save at any step (tests/unit/common/fault_injection_fs.h). Readers use
// the real file system.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/file_system.h"
#include "common/status.h"
#include "proto/drover.pb.h"
#include "worker/engine/kernels/host_floats.h"
#include "worker/engine/model/global_part.h"

namespace drover::engine::ckpt {

// 2: shards carry runs. Format 1 (one range per shard) is still read.
inline constexpr int kManifestFormatVersion = 3;
inline constexpr char kManifestFile[] = "manifest.json";

// Everything one checkpoint holds, in host memory, as the global arenas. `meta` carries every
// manifest field except `shards`, which the writer fills in (and the reader fills from disk).
struct CheckpointSnapshot {
  v1::CheckpointManifest meta;
  std::vector<float> params;  // (num_params,)
  std::vector<float> adam_m;  // (num_params,)
  std::vector<float> adam_v;  // (num_params,)
};

// What one rank of a resuming job holds of a checkpoint (ReadCheckpointPart): the manifest,
// and the elements of each global arena it asked for.
struct CheckpointPart {
  v1::CheckpointManifest meta;
  GlobalPart params, adam_m, adam_v;
  int64_t bytes_read = 0;  // the bytes of shard files read (whole blocks)
};

// The elements of the global arenas a rank asks a checkpoint for: `params` of the
// parameters, `optimizer` of both AdamW moments.
struct PartRequest {
  std::vector<ElementRange> params, optimizer;
};

// Decides from a checkpoint's directory and manifest what to read of it: a PartRequest, or
// InvalidArgument to refuse the checkpoint (one of another model), which the readers below
// return as it is instead of passing on to an older checkpoint. A DataLoss from it counts as
// the checkpoint being broken.
using PartRequestFn = std::function<StatusOr<PartRequest>(const std::string& step_dir,
                                                          const v1::CheckpointManifest&)>;

// Told how a read of a checkpoint goes: the bytes of step_dir's shard files read so far, of
// `total` the read needs (whole blocks), at its start (0) and after each block. Called from
// the reading threads, one call at a time.
using ReadProgressFn =
    std::function<void(const std::string& step_dir, int64_t bytes_read, int64_t total)>;

// One rank's part of a checkpoint, in host memory: the elements of each global arena at
// `runs`, in run order. The arrays may be page-locked (kernels/host_floats.h).
struct RankShard {
  int rank = 0;
  std::vector<v1::CheckpointRun> runs;
  HostFloats params, adam_m, adam_v;  // (sum of length * count over runs,) each
};

// "step_<step>" inside `dir`, and the temporary directory attempt `attempt` writes it in.
std::string StepDirName(int64_t step);
std::string TmpDirName(int64_t step, int64_t attempt);

// Writes `shard`'s three files into <dir>/TmpDirName(meta.step, meta.attempt)/ (created if
// needed), each fsynced, and returns their manifest entries. On failure the files it wrote
// are removed. Any rank, concurrently with the others. `progress` (optional) is told how the
// write goes.
// Told how a rank's write of its shard files goes: the bytes written and synced so far of
// `total`, at the start (0) and after each kWriteChunkBytes (and each file's last piece).
using WriteProgressFn = std::function<void(int64_t bytes_written, int64_t total)>;
// A shard file is appended and synced this much at a time, so that what progress says is on
// the disk (a file's one fsync at its end could take minutes on slow storage, unreported).
inline constexpr size_t kWriteChunkBytes = size_t{64} << 20;

StatusOr<std::vector<v1::CheckpointShard>> WriteShard(const std::string& dir,
                                                      const v1::CheckpointManifest& meta,
                                                      const RankShard& shard,
                                                      FileSystem* fs = FileSystem::Default(),
                                                      const WriteProgressFn& progress = nullptr);

// After every rank's WriteShard succeeded: writes `meta` with `shards` as the manifest,
// checks that the shards tile every arena (Internal if not: never publish a checkpoint that
// would not load), and renames the tmp directory to <dir>/step_<meta.step>/, replacing an
// existing one of the same step; fsyncs `dir` and its parent. On failure the tmp directory
// is removed (when only an fsync after the rename failed, step_N/ is complete but may not
// survive a crash, and the error is returned). One rank.
StatusOr<std::string> CommitCheckpoint(const std::string& dir, const v1::CheckpointManifest& meta,
                                       const std::vector<v1::CheckpointShard>& shards,
                                       FileSystem* fs = FileSystem::Default());

// Removes the tmp directory of meta's step and attempt (a checkpoint some rank failed).
void AbandonCheckpoint(const std::string& dir, const v1::CheckpointManifest& meta,
                       FileSystem* fs = FileSystem::Default());

// A whole snapshot written by one process: WriteShard of every element as rank 0, then
// CommitCheckpoint; creates `dir` if needed. Returns the final directory.
StatusOr<std::string> WriteCheckpoint(const std::string& dir, const CheckpointSnapshot& snap,
                                      FileSystem* fs = FileSystem::Default());

// The manifest of step_N/ (parsed, format version checked; shards not read).
StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir);

// Reads step_N/ and verifies it (holding a shared lock on it that pruning respects): the manifest
// parses, the format version is known, every arena is covered exactly by its shards, every file has
// its recorded size and CRC32C. DataLoss names the first problem found. Shard files are read
// by up to 8 threads.
StatusOr<CheckpointSnapshot> ReadCheckpoint(const std::string& step_dir);

// ReadCheckpoint for one rank: the same checks of the manifest (and that it says `step`),
// then only the blocks of shard files that hold an element `want` asks for, each streamed
// through and verified (the file's size, each block's CRC32C, and the whole file's when all
// of it is read; a file of a writer without block checksums is read and verified whole);
// the other blocks are neither read nor verified, and only the requested elements are kept.
// (A trainer rank asks for its data-parallel share of its stage, ParallelGpt::ShareRanges,
// so that replicas do not read the same blocks, whatever mesh wrote the checkpoint; a
// tensor-parallel rank's slice of a row-parallel matrix has a piece in every row, and so in
// every block of it.) DataLoss names the first problem; want's InvalidArgument is returned
// as it is, and so is a request past the arena's end. Every shard file's size is checked
// before any is read; `progress` (optional) is told how the read goes.
StatusOr<CheckpointPart> ReadCheckpointPart(const std::string& step_dir, int64_t step,
                                            const PartRequestFn& want,
                                            const ReadProgressFn& progress = nullptr);

// The error for a directory whose checkpoints are all unusable, each reason on its line:
// starting from scratch over them would overwrite what may be days of training, which
// must be a person's explicit choice.
Status NoneUsableError(const std::string& dir, const std::vector<std::string>& reasons);

// What can be checked of step_N/ without reading its shards: the manifest parses, says
// `step`, names only known arenas, its shards tile every arena, and every shard file has
// its recorded size. A multi-rank restore picks by this, then every rank reads (and
// CRC-checks) in parallel with the others. DataLoss names the first problem.
Status CheckCheckpointShape(const std::string& step_dir, int64_t step);

// Complete step_N/ directories in `dir` (never *.tmp), as (step, path), newest first.
// A missing `dir` is an empty list.
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(
    const std::string& dir, FileSystem* fs = FileSystem::Default());

// ReadCheckpoint, and the manifest's step must be the directory's `step`.
StatusOr<CheckpointSnapshot> VerifyCheckpoint(const std::string& step_dir, int64_t step);

// The newest checkpoint in `dir` that VerifyCheckpoint accepts; every newer one that fails
// is logged with the reason and skipped. NotFound when `dir` holds no step_N/ at all;
// FailedPrecondition naming each one and why when some exist and none is usable (the caller
// must not start from scratch over them). `path` (optional) receives the chosen directory.
StatusOr<CheckpointSnapshot> LoadLatestCheckpoint(const std::string& dir,
                                                  std::string* path = nullptr);
// The same with ReadCheckpointPart; want's refusal ends the search with its error.
StatusOr<CheckpointPart> LoadLatestCheckpointPart(const std::string& dir, const PartRequestFn& want,
                                                  std::string* path = nullptr,
                                                  const ReadProgressFn& progress = nullptr);

// Deletes all but the newest `keep_last` complete checkpoints (keep_last <= 0 keeps all),
// except any being read (ReadCheckpoint's lock, in any process), and every leftover
// step_N.tmp/ older than the newest complete one.
Status PruneCheckpoints(const std::string& dir, int keep_last,
                        FileSystem* fs = FileSystem::Default());

}  // namespace drover::engine::ckpt
