#include "worker/engine/ckpt/checkpoint.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/file_system.h"
#include "common/files.h"
#include "worker/engine/ckpt/checkpoint_format.h"

// Writing a checkpoint (its shards, then the commit that makes it complete), and the
// checkpoint directory's names, listing and pruning. Reading is checkpoint_read.cc.
namespace drover::engine::ckpt {
namespace {

using internal::CheckCoverage;
using internal::Join;
using internal::kArenas;
using internal::kBlockBytes;
using internal::NotBeingRead;
using internal::ParseStepDir;
using internal::RunsSize;

const std::vector<float>& ArenaOf(const CheckpointSnapshot& s, const std::string& name) {
  if (name == "adam_m") return s.adam_m;
  if (name == "adam_v") return s.adam_v;
  return s.params;
}

template <typename Floats>
std::string_view BytesOf(const Floats& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
}

const HostFloats& ShardArena(const RankShard& s, const std::string& name) {
  if (name == "adam_m") return s.adam_m;
  if (name == "adam_v") return s.adam_v;
  return s.params;
}

std::string TmpDirOf(const std::string& dir, const v1::CheckpointManifest& meta) {
  return Join(dir, TmpDirName(meta.step(), meta.attempt()));
}

}  // namespace

std::string StepDirName(int64_t step) { return "step_" + std::to_string(step); }

std::string TmpDirName(int64_t step, int64_t attempt) {
  return StepDirName(step) + ".a" + std::to_string(attempt) + ".tmp";
}

StatusOr<std::vector<v1::CheckpointShard>> WriteShard(const std::string& dir,
                                                      const v1::CheckpointManifest& meta,
                                                      const RankShard& shard, FileSystem* fs,
                                                      const WriteProgressFn& progress) {
  const int64_t n = RunsSize(shard.runs);
  for (const char* arena : kArenas) {
    if (static_cast<int64_t>(ShardArena(shard, arena).size()) != n) {
      return InvalidArgumentError(std::string("checkpoint shard of arena '") + arena + "' has " +
                                  std::to_string(ShardArena(shard, arena).size()) +
                                  " elements, its runs " + std::to_string(n));
    }
  }
  const std::string tmp_dir = TmpDirOf(dir, meta);
  RETURN_IF_ERROR(fs->MakeDirs(tmp_dir));
  int64_t lo = INT64_MAX, hi = 0;
  for (const auto& r : shard.runs) {
    lo = std::min(lo, r.begin());
    hi = std::max(hi, r.begin() + (r.count() - 1) * r.stride() + r.length());
  }
  const auto total = static_cast<int64_t>(3 * n * sizeof(float));
  int64_t written = 0;
  if (progress) progress(0, total);
  std::vector<v1::CheckpointShard> out;
  for (const char* arena : kArenas) {
    const HostFloats& data = ShardArena(shard, arena);
    const std::string file = std::string(arena) + ".r" + std::to_string(shard.rank) + ".bin";
    const size_t bytes = data.size() * sizeof(float);
    // Synced as it goes (kWriteChunkBytes; the last piece by WriteFileSynced), named
    // durably by the commit's fsync of the directory.
    const std::string_view all = BytesOf(data);
    const int64_t file_starts_at = written;
    Status st = WriteFileSynced(fs, Join(tmp_dir, file), [&](WritableFile& f) -> Status {
      for (size_t at = 0; at < all.size(); at += kWriteChunkBytes) {
        const std::string_view piece = all.substr(at, kWriteChunkBytes);
        RETURN_IF_ERROR(f.Append(piece));
        if (at + piece.size() == all.size()) break;
        RETURN_IF_ERROR(f.Sync());
        written += static_cast<int64_t>(piece.size());
        if (progress) progress(written, total);
      }
      return OkStatus();
    });
    if (!st.ok()) {
      // A failed write (a full disk) must not leave this rank's other files holding the
      // space (WriteFileSynced removed the failed one).
      for (const auto& done : out) (void)fs->RemoveFile(Join(tmp_dir, done.file()));
      return st;
    }
    if (!all.empty()) {
      written = file_starts_at + static_cast<int64_t>(all.size());
      if (progress) progress(written, total);
    }
    v1::CheckpointShard& sh = out.emplace_back();
    sh.set_file(file);
    sh.set_arena(arena);
    sh.set_begin(n > 0 ? lo : 0);
    sh.set_end(n > 0 ? hi : 0);
    sh.set_bytes(static_cast<int64_t>(bytes));
    const std::string_view file_bytes = BytesOf(data);
    sh.set_crc32c(crc32c::Value(file_bytes.data(), bytes));
    sh.set_block_bytes(static_cast<uint32_t>(kBlockBytes));
    for (size_t at = 0; at < bytes; at += kBlockBytes) {
      sh.add_block_crc32c(crc32c::Value(file_bytes.data() + at, std::min(kBlockBytes, bytes - at)));
    }
    sh.set_rank(shard.rank);
    for (const auto& r : shard.runs) *sh.add_runs() = r;
  }
  return out;
}

StatusOr<std::string> CommitCheckpoint(const std::string& dir, const v1::CheckpointManifest& meta,
                                       const std::vector<v1::CheckpointShard>& shards,
                                       FileSystem* fs) {
  const std::string tmp_dir = TmpDirOf(dir, meta);
  const std::string final_dir = Join(dir, StepDirName(meta.step()));
  v1::CheckpointManifest manifest = meta;
  manifest.clear_shards();
  for (const auto& sh : shards) {
    if (sh.runs_size() > 0 || sh.bytes() > 0) *manifest.add_shards() = sh;  // skip empty shards
  }
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_dtype("fp32");
  auto commit = [&]() -> Status {
    // Never publish a checkpoint that would not load.
    Status cov = CheckCoverage(manifest);
    if (!cov.ok()) return InternalError("the shards do not make a checkpoint: " + cov.message());
    ASSIGN_OR_RETURN(std::string json, internal::SealManifest(manifest));
    // The manifest goes last: a directory with a manifest has all its shards.
    RETURN_IF_ERROR(WriteFileSynced(fs, Join(tmp_dir, kManifestFile), json));
    // The files' names must be durable before the rename can be: otherwise a crash could
    // keep step_N/ and lose the files in it.
    RETURN_IF_ERROR(fs->SyncDir(tmp_dir));
    RETURN_IF_ERROR(fs->RemoveAll(final_dir));
    RETURN_IF_ERROR(RenameAtomic(fs, tmp_dir, final_dir));
    // This save may have created `dir` itself (the first one, or after someone removed it):
    // its own name must survive a crash too, or every checkpoint in it goes.
    return fs->SyncDir(Dirname(Dirname(final_dir)));
  };
  Status st = commit();
  if (!st.ok()) {
    AbandonCheckpoint(dir, meta, fs);
    return st;
  }
  return final_dir;
}

void AbandonCheckpoint(const std::string& dir, const v1::CheckpointManifest& meta, FileSystem* fs) {
  (void)fs->RemoveAll(TmpDirOf(dir, meta));
}

StatusOr<std::string> WriteCheckpoint(const std::string& dir, const CheckpointSnapshot& snap,
                                      FileSystem* fs) {
  const int64_t n = snap.meta.num_params();
  for (const char* arena : kArenas) {
    if (static_cast<int64_t>(ArenaOf(snap, arena).size()) != n) {
      return InvalidArgumentError(std::string("checkpoint arena '") + arena + "' has " +
                                  std::to_string(ArenaOf(snap, arena).size()) +
                                  " elements, manifest says num_params=" + std::to_string(n));
    }
  }
  RETURN_IF_ERROR(fs->MakeDirs(dir));
  AbandonCheckpoint(dir, snap.meta, fs);  // a leftover of a crash at this very step
  RankShard whole;
  whole.runs.emplace_back();
  whole.runs[0].set_begin(0);
  whole.runs[0].set_length(n);
  whole.runs[0].set_stride(n);
  whole.runs[0].set_count(1);
  whole.params.assign(snap.params.begin(), snap.params.end());
  whole.adam_m.assign(snap.adam_m.begin(), snap.adam_m.end());
  whole.adam_v.assign(snap.adam_v.begin(), snap.adam_v.end());
  auto shards = WriteShard(dir, snap.meta, whole, fs);
  if (!shards.ok()) {
    AbandonCheckpoint(dir, snap.meta, fs);
    return shards.status();
  }
  return CommitCheckpoint(dir, snap.meta, *shards, fs);
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir,
                                                             FileSystem* fs) {
  std::vector<std::pair<int64_t, std::string>> out;
  auto names = fs->ListDir(dir);
  if (!names.ok()) return out;
  for (const std::string& name : *names) {
    bool is_tmp = false;
    const int64_t step = ParseStepDir(name, &is_tmp);
    if (step < 0 || is_tmp) continue;
    const std::string path = Join(dir, name);
    if (auto info = fs->Stat(path); info.ok() && info->is_directory) out.emplace_back(step, path);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

Status PruneCheckpoints(const std::string& dir, int keep_last, FileSystem* fs) {
  auto complete = ListCheckpoints(dir, fs);
  const int64_t newest = complete.empty() ? -1 : complete.front().first;
  if (auto names = fs->ListDir(dir); names.ok()) {
    for (const std::string& name : *names) {
      bool is_tmp = false;
      const int64_t step = ParseStepDir(name, &is_tmp);
      if (is_tmp && step >= 0 && step <= newest) (void)fs->RemoveAll(Join(dir, name));
    }
  }
  if (keep_last <= 0) return OkStatus();
  for (size_t i = static_cast<size_t>(keep_last); i < complete.size(); ++i) {
    if (!NotBeingRead(complete[i].second)) {
      spdlog::info("checkpoint {} is being read; kept past retention", complete[i].second);
      continue;
    }
    // Renamed out of the complete names first: rm -rf removes files one by one, and a
    // trainer killed part-way (SIGKILL after the stop's grace) would leave a step_N/ that
    // lists as complete while its manifest or a shard is gone. "step_N.tmp" is a name no
    // writer uses (theirs carry ".a<attempt>") and the sweep above removes it next time
    // when this removal is cut short.
    const std::string doomed = Join(dir, StepDirName(complete[i].first) + ".tmp");
    RETURN_IF_ERROR(fs->Rename(complete[i].second, doomed));
    RETURN_IF_ERROR(fs->RemoveAll(doomed));
  }
  return OkStatus();
}

}  // namespace drover::engine::ckpt
