// What checkpoint.cc (writing, and the checkpoint directory's names, listing and pruning)
// and checkpoint_read.cc (reading) share of the on-disk format (checkpoint.h): the arenas,
// the block size, a shard's runs and the manifest's coverage check, step directory names,
// and the read lock that keeps pruning away from a checkpoint being read. Internal to
// worker/engine/ckpt/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/drover.pb.h"

namespace drover::engine::ckpt::internal {

inline constexpr const char* kArenas[] = {"params", "adam_m", "adam_v"};

// Shard files are written in checksummed blocks of this size and read a block at a time: a
// reader holds one such buffer per thread, not the file (a shard of a large model is
// hundreds of megabytes, read by up to 8 threads), and reads only the blocks it needs. A
// manifest may name other sizes up to kMaxBlockBytes (each reader thread allocates one).
inline constexpr size_t kBlockBytes = size_t{1} << 20;
inline constexpr uint64_t kMaxBlockBytes = uint64_t{16} << 20;

// dir/name.
std::string Join(const std::string& dir, const std::string& name);

// Parses "step_<digits>" and the temporary "step_<digits>[.a<attempt>].tmp"; -1 otherwise.
int64_t ParseStepDir(const std::string& name, bool* is_tmp);

// A shard's runs; a format-1 shard (no runs) is the one range [begin, end).
std::vector<v1::CheckpointRun> RunsOf(const v1::CheckpointShard& sh);
// Elements in `runs`.
int64_t RunsSize(const std::vector<v1::CheckpointRun>& runs);

// The manifest file's text: JSON with proto field names, sealed with the CRC32C of that
// text (manifest_crc32c, whose own digits count as 4294967295). The shards carry CRCs of
// their own; the seal covers what only the manifest says (the sample position, the RNG, the
// optimizer's step count, the loss scaler), which a damaged key would otherwise drop without
// a word: the reader ignores fields it does not know, so that newer writers may add some.
StatusOr<std::string> SealManifest(const v1::CheckpointManifest& manifest);

// DataLoss naming `path` unless `text` (the file, parsed as `m`) carries a seal that
// matches it; a manifest of format 1 or 2 carries none and needs none.
Status CheckManifestSeal(const std::string& path, const std::string& text,
                         const v1::CheckpointManifest& m);

// Checks that every run lies inside [0, num_params) and that the runs of each arena's
// shards cover every element exactly once (a bitmap: runs may interleave).
Status CheckCoverage(const v1::CheckpointManifest& m);

// A shared flock on a step directory while it is read: pruning (in this process or another,
// say a trainer of the job while `drover sample` reads) skips a checkpoint being read.
class ReadLock {
 public:
  explicit ReadLock(const std::string& step_dir);
  ~ReadLock();
  ReadLock(const ReadLock&) = delete;
  ReadLock& operator=(const ReadLock&) = delete;

 private:
  int fd_;
};

// True when nobody holds a ReadLock on `step_dir` (or it cannot be opened). The exclusive
// lock is dropped at once: a reader that starts after this finds the directory gone or
// complete, never half-deleted, because a reader verifies every file it reads.
bool NotBeingRead(const std::string& step_dir);

}  // namespace drover::engine::ckpt::internal
