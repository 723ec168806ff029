#include "worker/engine/ckpt/checkpoint.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "common/crc32c.h"
#include "common/file_system.h"
#include "common/files.h"

namespace drover::engine::ckpt {
namespace {

constexpr const char* kArenas[] = {"params", "adam_m", "adam_v"};

// Shard files are written in checksummed blocks of this size and read a block at a time: a
// reader holds one such buffer per thread, not the file (a shard of a large model is
// hundreds of megabytes, read by up to 8 threads), and reads only the blocks it needs. A
// manifest may name other sizes up to kMaxBlockBytes (each reader thread allocates one).
constexpr size_t kBlockBytes = size_t{1} << 20;
constexpr uint64_t kMaxBlockBytes = uint64_t{16} << 20;

const std::vector<float>& ArenaOf(const CheckpointSnapshot& s, const std::string& name) {
  if (name == "adam_m") return s.adam_m;
  if (name == "adam_v") return s.adam_v;
  return s.params;
}

// The part holding arena `name`; null for a name this build does not know.
GlobalPart* PartOf(CheckpointPart* p, const std::string& name) {
  if (name == "params") return &p->params;
  if (name == "adam_m") return &p->adam_m;
  if (name == "adam_v") return &p->adam_v;
  return nullptr;
}

std::string Join(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

template <typename Floats>
std::string_view BytesOf(const Floats& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
}

// Parses "step_<digits>" and the temporary "step_<digits>[.a<attempt>].tmp"; -1 otherwise.
int64_t ParseStepDir(const std::string& name, bool* is_tmp) {
  constexpr std::string_view kPrefix = "step_";
  std::string_view s = name;
  if (s.substr(0, kPrefix.size()) != kPrefix) return -1;
  s.remove_prefix(kPrefix.size());
  *is_tmp = false;
  if (s.size() > 4 && s.substr(s.size() - 4) == ".tmp") {
    *is_tmp = true;
    s.remove_suffix(4);
    if (size_t dot = s.find(".a"); dot != std::string_view::npos) s = s.substr(0, dot);
  }
  int64_t step = -1;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), step);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty() || step < 0) return -1;
  return step;
}

// A shard's runs; a format-1 shard (no runs) is the one range [begin, end).
std::vector<v1::CheckpointRun> RunsOf(const v1::CheckpointShard& sh) {
  if (sh.runs_size() > 0) return {sh.runs().begin(), sh.runs().end()};
  v1::CheckpointRun r;
  r.set_begin(sh.begin());
  r.set_length(sh.end() - sh.begin());
  r.set_stride(sh.end() - sh.begin());
  r.set_count(1);
  return {r};
}

int64_t RunsSize(const std::vector<v1::CheckpointRun>& runs) {
  int64_t n = 0;
  for (const auto& r : runs) n += r.length() * r.count();
  return n;
}

// A shared flock on a step directory while it is read: pruning (in this process or another,
// say a trainer of the job while `drover sample` reads) skips a checkpoint being read.
class ReadLock {
 public:
  explicit ReadLock(const std::string& step_dir)
      : fd_(::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (fd_ >= 0) (void)::flock(fd_, LOCK_SH);
  }
  ~ReadLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadLock(const ReadLock&) = delete;
  ReadLock& operator=(const ReadLock&) = delete;

 private:
  int fd_;
};

// True when nobody holds a ReadLock on `step_dir` (or it cannot be opened). The exclusive
// lock is dropped at once: a reader that starts after this finds the directory gone or
// complete, never half-deleted, because a reader verifies every file it reads.
bool NotBeingRead(const std::string& step_dir) {
  int fd = ::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return true;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

// Checks that every run lies inside [0, num_params) and that the runs of each arena's
// shards cover every element exactly once (a bitmap: runs may interleave).
Status CheckCoverage(const v1::CheckpointManifest& m) {
  const int64_t n = m.num_params();
  for (const char* arena : kArenas) {
    std::vector<bool> seen(static_cast<size_t>(n), false);
    int64_t covered = 0;
    for (const auto& sh : m.shards()) {
      if (sh.arena() != arena) continue;
      for (const auto& r : RunsOf(sh)) {
        const bool sane = r.begin() >= 0 && r.length() > 0 && r.count() > 0 &&
                          (r.count() == 1 || r.stride() >= r.length()) && r.begin() <= n &&
                          r.length() <= n && r.count() <= n &&
                          (r.count() == 1 || r.stride() <= n) &&
                          r.begin() + (r.count() - 1) * r.stride() + r.length() <= n;
        if (!sane) {
          return DataLossError("shard " + sh.file() + " has a run outside [0, " +
                               std::to_string(n) + ") of arena '" + arena + "'");
        }
        for (int64_t i = 0; i < r.count(); ++i) {
          const int64_t b = r.begin() + i * r.stride();
          for (int64_t e = b; e < b + r.length(); ++e) {
            if (seen[static_cast<size_t>(e)]) {
              return DataLossError("shards of arena '" + std::string(arena) +
                                   "' overlap at element " + std::to_string(e));
            }
            seen[static_cast<size_t>(e)] = true;
          }
          covered += r.length();
        }
      }
    }
    if (covered != n) {
      return DataLossError("shards of arena '" + std::string(arena) + "' cover " +
                           std::to_string(covered) + " of " + std::to_string(n) + " elements");
    }
  }
  return OkStatus();
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
                                                      const RankShard& shard, FileSystem* fs) {
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
  std::vector<v1::CheckpointShard> out;
  for (const char* arena : kArenas) {
    const HostFloats& data = ShardArena(shard, arena);
    const std::string file = std::string(arena) + ".r" + std::to_string(shard.rank) + ".bin";
    const size_t bytes = data.size() * sizeof(float);
    // Synced now, named durably by the commit's fsync of the directory.
    Status st = WriteFileSynced(fs, Join(tmp_dir, file), BytesOf(data));
    if (!st.ok()) {
      // A failed write (a full disk) must not leave this rank's other files holding the
      // space (WriteFileSynced removed the failed one).
      for (const auto& done : out) (void)fs->RemoveFile(Join(tmp_dir, done.file()));
      return st;
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
    std::string json;
    google::protobuf::util::JsonPrintOptions opts;
    opts.add_whitespace = true;
    opts.preserve_proto_field_names = true;
    if (!google::protobuf::util::MessageToJsonString(manifest, &json, opts).ok()) {
      return InternalError("cannot encode checkpoint manifest as JSON");
    }
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

StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir) {
  auto text = ReadFileToString(Join(step_dir, kManifestFile));
  if (!text.ok()) return DataLossError(step_dir + ": no readable " + kManifestFile);
  v1::CheckpointManifest m;
  google::protobuf::util::JsonParseOptions popts;
  popts.ignore_unknown_fields = true;  // newer writers may add fields
  auto parsed = google::protobuf::util::JsonStringToMessage(*text, &m, popts);
  if (!parsed.ok()) {
    return DataLossError(step_dir +
                         ": manifest is not valid JSON: " + std::string(parsed.message()));
  }
  if (m.format_version() < 1 || m.format_version() > kManifestFormatVersion) {
    return DataLossError(step_dir + ": manifest format_version " +
                         std::to_string(m.format_version()) + ", this build reads 1 to " +
                         std::to_string(kManifestFormatVersion));
  }
  return m;
}

namespace {

// What can be checked without reading a shard: parameters, known arenas, shard names and
// file sizes, exact coverage. The sizes come before the coverage check because that check
// and the reader allocate by num_params: a manifest is believed about num_params only as
// far as the shard files on disk hold that many elements of each arena (a fuzzed manifest
// claiming 10^12 parameters made ReadCheckpoint allocate terabytes).
Status CheckManifestShape(const std::string& step_dir, const v1::CheckpointManifest& m) {
  if (m.num_params() <= 0) return DataLossError(step_dir + ": manifest has no parameters");
  std::map<std::string, int64_t> arena_bytes;
  for (const auto& sh : m.shards()) {
    if (std::find(std::begin(kArenas), std::end(kArenas), sh.arena()) == std::end(kArenas)) {
      return DataLossError(step_dir + ": shard " + sh.file() + " is of arena '" + sh.arena() +
                           "', which this build does not know (it reads params, adam_m, adam_v)");
    }
    // Shards live in the step directory: a name that leaves it would read any file.
    if (sh.file().empty() || sh.file() == "." || sh.file() == ".." ||
        sh.file().find('/') != std::string::npos) {
      return DataLossError(step_dir + ": shard file name '" + sh.file() +
                           "' is not a file in the checkpoint directory");
    }
    std::error_code ec;
    const auto size = std::filesystem::file_size(Join(step_dir, sh.file()), ec);
    if (ec) return DataLossError(step_dir + ": missing shard " + sh.file());
    if (static_cast<int64_t>(size) != sh.bytes()) {
      return DataLossError(Join(step_dir, sh.file()) + ": the file is " + std::to_string(size) +
                           " bytes, the manifest says " + std::to_string(sh.bytes()));
    }
    if (sh.block_bytes() > 0 || sh.block_crc32c_size() > 0) {
      const uint64_t block = sh.block_bytes();
      if (block == 0 || block % sizeof(float) != 0 || block > kMaxBlockBytes ||
          static_cast<uint64_t>(sh.block_crc32c_size()) != (size + block - 1) / block) {
        return DataLossError(Join(step_dir, sh.file()) + ": the manifest's " +
                             std::to_string(sh.block_crc32c_size()) + " block checksums of " +
                             std::to_string(block) + " bytes do not fit the file's " +
                             std::to_string(size) + " bytes");
      }
    }
    arena_bytes[sh.arena()] += static_cast<int64_t>(size);  // real files: cannot overflow
  }
  for (const char* arena : kArenas) {
    const int64_t bytes = arena_bytes[arena];
    if (bytes % static_cast<int64_t>(sizeof(float)) != 0 ||
        bytes / static_cast<int64_t>(sizeof(float)) != m.num_params()) {
      return DataLossError(step_dir + ": shards of arena '" + arena + "' hold " +
                           std::to_string(bytes) + " bytes, manifest says " +
                           std::to_string(m.num_params()) + " fp32 parameters");
    }
  }
  Status cov = CheckCoverage(m);
  return cov.ok() ? cov : cov.WithContext(step_dir);
}

// Calls fn(global_begin, global_end) for each contiguous piece of a shard's runs, in file
// order (the order of its elements in the file).
template <typename Fn>
void ForEachPiece(const std::vector<v1::CheckpointRun>& runs, Fn&& fn) {
  for (const auto& r : runs) {
    for (int64_t i = 0; i < r.count(); ++i) {
      const auto b = static_cast<size_t>(r.begin() + i * r.stride());
      fn(b, b + static_cast<size_t>(r.length()));
    }
  }
}

// Whether the shard holds an element of `part`.
bool HoldsSomeOf(const std::vector<v1::CheckpointRun>& runs, const GlobalPart& part) {
  bool some = false;
  ForEachPiece(runs, [&](size_t b, size_t e) {
    if (!some) part.ForEachHeld(b, e, [&](size_t, size_t) { some = true; });
  });
  return some;
}

// A contiguous piece of a shard file: file elements [at, at + n) are global elements
// [global, global + n).
struct FilePiece {
  size_t global, at, n;
};

// The spans of a shard file to read for `part`: the blocks holding an element of one of
// `pieces` that the part holds, adjacent blocks merged, in file order. A file without
// block checksums (an earlier writer's) is one span: it can only be verified whole.
std::vector<FileSpan> SpansToRead(const v1::CheckpointShard& sh,
                                  const std::vector<FilePiece>& pieces, const GlobalPart& part) {
  const auto bytes = static_cast<uint64_t>(sh.bytes());
  if (sh.block_bytes() == 0) return {{0, bytes}};
  const uint64_t block = sh.block_bytes();
  std::vector<FileSpan> spans;
  for (const FilePiece& p : pieces) {
    part.ForEachHeld(p.global, p.global + p.n, [&](size_t hb, size_t he) {
      const uint64_t b0 = (p.at + (hb - p.global)) * sizeof(float) / block;
      const uint64_t b1 = ((p.at + (he - p.global)) * sizeof(float) - 1) / block + 1;
      if (!spans.empty() && spans.back().offset + spans.back().length >= b0 * block) {
        spans.back().length = std::max(spans.back().length, b1 * block - spans.back().offset);
      } else {
        spans.push_back({b0 * block, (b1 - b0) * block});
      }
    });
  }
  if (!spans.empty()) {
    FileSpan& last = spans.back();
    last.length = std::min(last.length, bytes - last.offset);
  }
  return spans;
}

// Reads the blocks of one shard file that hold elements `part` holds (the whole file when it
// has no block checksums), verifies the file's size and each block's CRC32C (the whole
// file's too when every block is read), and copies those elements into the part as they
// stream past, adding their number to *copied and the bytes read to *bytes_read (a block
// that fails its CRC fails the whole read, so what was copied is never used). Shards of
// one checkpoint cover disjoint elements, so they may be read into one part concurrently.
Status ReadShardInto(const std::string& step_dir, const v1::CheckpointShard& sh, GlobalPart* part,
                     std::atomic<size_t>* copied, std::atomic<int64_t>* bytes_read) {
  const std::string path = Join(step_dir, sh.file());
  const std::vector<v1::CheckpointRun> runs = RunsOf(sh);
  const int64_t want = RunsSize(runs) * static_cast<int64_t>(sizeof(float));
  // Two different disagreements, each with its own pair of numbers: one message for both
  // printed the same number twice when the manifest's byte count was the wrong one.
  std::error_code ec;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec) return DataLossError(step_dir + ": missing shard " + sh.file());
  if (size != want) {
    return DataLossError(path + ": the file is " + std::to_string(size) +
                         " bytes, the manifest's runs cover " + std::to_string(want));
  }
  if (sh.bytes() != want) {
    return DataLossError(path + ": the manifest says " + std::to_string(sh.bytes()) +
                         " bytes, but its runs cover " + std::to_string(want));
  }
  std::vector<FilePiece> pieces;
  size_t at = 0;
  ForEachPiece(runs, [&](size_t b, size_t e) {
    pieces.push_back({b, at, e - b});
    at += e - b;
  });
  const std::vector<FileSpan> spans = SpansToRead(sh, pieces, *part);
  const bool whole =
      spans.size() == 1 && spans[0].offset == 0 && spans[0].length == static_cast<uint64_t>(want);
  const size_t chunk = sh.block_bytes() > 0 ? sh.block_bytes() : kBlockBytes;
  uint32_t crc = 0;               // of the whole file, when it is read whole
  size_t next = 0, n_copied = 0;  // next: the first piece not behind the current chunk
  auto scatter = [&](uint64_t offset, const char* data, size_t bytes) {
    if (sh.block_bytes() > 0) {
      const uint64_t k = offset / chunk;
      const uint32_t got = crc32c::Value(data, bytes);
      if (got != sh.block_crc32c(static_cast<int>(k))) {
        return DataLossError(path + ": CRC32C mismatch in block " + std::to_string(k) + " (bytes " +
                             std::to_string(offset) + " to " + std::to_string(offset + bytes) +
                             "; file " + std::to_string(got) + ", manifest " +
                             std::to_string(sh.block_crc32c(static_cast<int>(k))) + ")");
      }
    }
    if (whole) crc = crc32c::Extend(crc, data, bytes);
    // Every chunk starts on an element (blocks are multiples of 4 bytes): elements [e0, e1).
    const size_t e0 = offset / sizeof(float), e1 = e0 + bytes / sizeof(float);
    while (next < pieces.size() && pieces[next].at + pieces[next].n <= e0) ++next;
    for (size_t i = next; i < pieces.size() && pieces[i].at < e1; ++i) {
      const FilePiece& p = pieces[i];
      const size_t a0 = std::max(p.at, e0), a1 = std::min(p.at + p.n, e1);
      const size_t g0 = p.global + (a0 - p.at);
      part->ForEachHeld(g0, g0 + (a1 - a0), [&](size_t hb, size_t he) {
        std::memcpy(part->MutableAt(hb, he - hb), data + (a0 - e0 + hb - g0) * sizeof(float),
                    (he - hb) * sizeof(float));
        n_copied += he - hb;
      });
    }
    return OkStatus();
  };
  StatusOr<size_t> read = ReadFileSpansInChunks(path, spans, chunk, scatter);
  if (!read.ok()) {
    if (read.status().code() == StatusCode::kDataLoss) return read.status();
    return DataLossError(path + ": " + std::string(read.status().message()));
  }
  if (whole && crc != sh.crc32c()) {
    return DataLossError(path + ": CRC32C mismatch (file " + std::to_string(crc) + ", manifest " +
                         std::to_string(sh.crc32c()) + ")");
  }
  copied->fetch_add(n_copied);
  bytes_read->fetch_add(static_cast<int64_t>(*read));
  return OkStatus();
}

}  // namespace

StatusOr<CheckpointPart> ReadCheckpointPart(const std::string& step_dir, int64_t step,
                                            const PartRequestFn& want) {
  ReadLock lock(step_dir);
  CheckpointPart part;
  ASSIGN_OR_RETURN(part.meta, ReadManifest(step_dir));
  const v1::CheckpointManifest& m = part.meta;
  if (step >= 0 && m.step() != step) {
    return DataLossError(step_dir + ": manifest says step " + std::to_string(m.step()));
  }
  RETURN_IF_ERROR(CheckManifestShape(step_dir, m));
  ASSIGN_OR_RETURN(PartRequest request, want(step_dir, m));
  part.params = GlobalPart(std::move(request.params));
  part.adam_m = GlobalPart(request.optimizer);
  part.adam_v = GlobalPart(std::move(request.optimizer));
  const auto n = static_cast<size_t>(m.num_params());
  for (const GlobalPart* p : {&part.params, &part.adam_m}) {
    if (p->end() > n) {
      return InvalidArgumentError(step_dir + " holds " + std::to_string(n) +
                                  " parameters; element " + std::to_string(p->end() - 1) +
                                  " was asked for");
    }
  }
  // The shard files that hold something asked for, read in parallel: a sharded checkpoint
  // has one file per rank and arena, and reading plus CRC32C of each is independent. The
  // first error (in file order) wins.
  std::vector<int> files;
  for (int i = 0; i < m.shards_size(); ++i) {
    if (!HoldsSomeOf(RunsOf(m.shards(i)), *PartOf(&part, m.shards(i).arena()))) continue;
    files.push_back(i);
  }
  const int count = static_cast<int>(files.size());
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  std::vector<Status> results(files.size());
  std::atomic<size_t> copied{0};
  std::atomic<int64_t> bytes_read{0};
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i = next++; i < count; i = next++) {
      const v1::CheckpointShard& sh = m.shards(files[static_cast<size_t>(i)]);
      results[static_cast<size_t>(i)] =
          ReadShardInto(step_dir, sh, PartOf(&part, sh.arena()), &copied, &bytes_read);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, count); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const Status& st : results) RETURN_IF_ERROR(st);
  part.bytes_read = bytes_read.load();
  // CheckManifestShape found that the shards tile every arena: each element asked for was
  // copied exactly once.
  const size_t asked = part.params.size() + part.adam_m.size() + part.adam_v.size();
  DROVER_CHECK_MSG(copied.load() == asked, step_dir);
  return part;
}

namespace {

// Every element of every arena.
StatusOr<PartRequest> Everything(const std::string&, const v1::CheckpointManifest& m) {
  const auto n = static_cast<size_t>(m.num_params());
  return PartRequest{{{0, n}}, {{0, n}}};
}

// The newest checkpoint in `dir` that `read` accepts, skipping (and logging) each broken one;
// a refusal (any error but DataLoss) ends the search.
template <typename T>
StatusOr<T> LoadNewest(const std::string& dir,
                       const std::function<StatusOr<T>(const std::string&, int64_t)>& read,
                       std::string* path) {
  const auto all = ListCheckpoints(dir);
  if (all.empty()) return NotFoundError("no checkpoint in " + dir);
  std::vector<std::string> reasons;
  for (const auto& [step, step_dir] : all) {
    StatusOr<T> got = read(step_dir, step);
    if (got.ok()) {
      if (path != nullptr) *path = step_dir;
      return got;
    }
    if (got.status().code() != StatusCode::kDataLoss) return got.status();
    spdlog::warn("checkpoint skipped: {}", got.status().message());
    reasons.emplace_back(got.status().message());
  }
  return NoneUsableError(dir, reasons);
}

// The whole checkpoint at step_dir (whose manifest must say `step`, unless it is -1).
StatusOr<CheckpointSnapshot> ReadWhole(const std::string& step_dir, int64_t step) {
  ASSIGN_OR_RETURN(CheckpointPart part, ReadCheckpointPart(step_dir, step, Everything));
  CheckpointSnapshot snap;
  snap.meta = std::move(part.meta);
  snap.params = std::move(part.params).TakeValues();
  snap.adam_m = std::move(part.adam_m).TakeValues();
  snap.adam_v = std::move(part.adam_v).TakeValues();
  return snap;
}

}  // namespace

StatusOr<CheckpointSnapshot> ReadCheckpoint(const std::string& step_dir) {
  return ReadWhole(step_dir, -1);
}

Status NoneUsableError(const std::string& dir, const std::vector<std::string>& reasons) {
  std::string why;
  for (const std::string& r : reasons) why += "\n  " + r;
  return FailedPreconditionError(
      "checkpoints exist in " + dir + " but none is usable:" + why +
      "\nmove them away (or use another checkpoint.dir) to start from scratch, or pass "
      "`drover train --fresh`");
}

Status CheckCheckpointShape(const std::string& step_dir, int64_t step) {
  ASSIGN_OR_RETURN(v1::CheckpointManifest m, ReadManifest(step_dir));
  if (m.step() != step) {
    return DataLossError(step_dir + ": manifest says step " + std::to_string(m.step()));
  }
  return CheckManifestShape(step_dir, m);  // it checks every shard's file size
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

StatusOr<CheckpointSnapshot> VerifyCheckpoint(const std::string& step_dir, int64_t step) {
  return ReadWhole(step_dir, step);
}

StatusOr<CheckpointSnapshot> LoadLatestCheckpoint(const std::string& dir, std::string* path) {
  return LoadNewest<CheckpointSnapshot>(dir, VerifyCheckpoint, path);
}

StatusOr<CheckpointPart> LoadLatestCheckpointPart(const std::string& dir, const PartRequestFn& want,
                                                  std::string* path) {
  return LoadNewest<CheckpointPart>(
      dir,
      [&](const std::string& step_dir, int64_t step) {
        return ReadCheckpointPart(step_dir, step, want);
      },
      path);
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
