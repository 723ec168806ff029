#include "worker/engine/ckpt/checkpoint.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/crc32c.h"
#include "common/files.h"

namespace drover::engine::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kArenas[] = {"params", "adam_m", "adam_v"};

const std::vector<float>& ArenaOf(const CheckpointSnapshot& s, const std::string& name) {
  if (name == "adam_m") return s.adam_m;
  if (name == "adam_v") return s.adam_v;
  return s.params;
}

std::vector<float>* MutableArenaOf(CheckpointSnapshot* s, const std::string& name) {
  if (name == "params") return &s->params;
  if (name == "adam_m") return &s->adam_m;
  if (name == "adam_v") return &s->adam_v;
  return nullptr;
}

// Writes `n` bytes and fsyncs before closing, so that the rename that publishes the
// directory can never expose a file whose data is still only in the page cache.
Status WriteFileDurably(const std::string& path, const void* data, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  const char* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      Status st = ErrnoToStatus(errno, "write " + path);
      ::close(fd);
      return st;
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    Status st = ErrnoToStatus(errno, "fsync " + path);
    ::close(fd);
    return st;
  }
  if (::close(fd) != 0) return ErrnoToStatus(errno, "close " + path);
  return OkStatus();
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLossError("cannot read " + path);
  return ss.str();
}

// Parses "step_<digits>" (and, with allow_tmp, "step_<digits>.tmp"); -1 otherwise.
int64_t ParseStepDir(const std::string& name, bool* is_tmp) {
  constexpr std::string_view kPrefix = "step_";
  std::string_view s = name;
  if (s.substr(0, kPrefix.size()) != kPrefix) return -1;
  s.remove_prefix(kPrefix.size());
  *is_tmp = false;
  if (s.size() > 4 && s.substr(s.size() - 4) == ".tmp") {
    *is_tmp = true;
    s.remove_suffix(4);
  }
  int64_t step = -1;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), step);
  if (ec != std::errc() || ptr != s.data() + s.size() || s.empty() || step < 0) return -1;
  return step;
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

// Checks that the shards of each arena tile [0, num_params) without gaps or overlaps.
Status CheckCoverage(const v1::CheckpointManifest& m) {
  for (const char* arena : kArenas) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const auto& sh : m.shards()) {
      if (sh.arena() == arena) ranges.emplace_back(sh.begin(), sh.end());
    }
    std::sort(ranges.begin(), ranges.end());
    int64_t next = 0;
    for (auto [b, e] : ranges) {
      if (b != next || e < b) {
        return DataLossError("shards of arena '" + std::string(arena) + "' do not tile [0, " +
                             std::to_string(m.num_params()) + ") at element " +
                             std::to_string(next));
      }
      next = e;
    }
    if (next != m.num_params()) {
      return DataLossError("shards of arena '" + std::string(arena) + "' cover " +
                           std::to_string(next) + " of " + std::to_string(m.num_params()) +
                           " elements");
    }
  }
  return OkStatus();
}

// Writes every shard and the manifest into tmp_dir, then renames it to final_dir.
Status WriteStepDir(const std::string& tmp_dir, const std::string& final_dir,
                    const std::string& dir, const CheckpointSnapshot& snap) {
  const int64_t n = snap.meta.num_params();
  std::error_code ec;
  v1::CheckpointManifest manifest = snap.meta;
  manifest.clear_shards();
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_dtype("fp32");
  for (const char* arena : kArenas) {
    const std::vector<float>& data = ArenaOf(snap, arena);
    const std::string file = std::string(arena) + ".r0.bin";
    const size_t bytes = data.size() * sizeof(float);
    RETURN_IF_ERROR(WriteFileDurably((fs::path(tmp_dir) / file).string(), data.data(), bytes));
    v1::CheckpointShard* sh = manifest.add_shards();
    sh->set_file(file);
    sh->set_arena(arena);
    sh->set_begin(0);
    sh->set_end(n);
    sh->set_bytes(static_cast<int64_t>(bytes));
    sh->set_crc32c(crc32c::Value(data.data(), bytes));
    sh->set_rank(0);
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(manifest, &json, opts).ok()) {
    return InternalError("cannot encode checkpoint manifest as JSON");
  }
  // The manifest goes last: a directory with a manifest has all its shards.
  RETURN_IF_ERROR(
      WriteFileDurably((fs::path(tmp_dir) / kManifestFile).string(), json.data(), json.size()));
  RETURN_IF_ERROR(FsyncDir(tmp_dir));
  fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) return UnavailableError("cannot rename " + tmp_dir + ": " + ec.message());
  return FsyncDir(dir);
}

}  // namespace

std::string StepDirName(int64_t step) { return "step_" + std::to_string(step); }

StatusOr<std::string> WriteCheckpoint(const std::string& dir, const CheckpointSnapshot& snap) {
  const int64_t n = snap.meta.num_params();
  for (const char* arena : kArenas) {
    if (static_cast<int64_t>(ArenaOf(snap, arena).size()) != n) {
      return InvalidArgumentError(std::string("checkpoint arena '") + arena + "' has " +
                                  std::to_string(ArenaOf(snap, arena).size()) +
                                  " elements, manifest says num_params=" + std::to_string(n));
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create checkpoint dir " + dir + ": " + ec.message());
  const std::string final_dir = (fs::path(dir) / StepDirName(snap.meta.step())).string();
  const std::string tmp_dir = final_dir + ".tmp";
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return UnavailableError("cannot create " + tmp_dir + ": " + ec.message());
  // A failed write (a full disk) must not leave its partial files holding the space.
  Status written = WriteStepDir(tmp_dir, final_dir, dir, snap);
  if (!written.ok()) {
    fs::remove_all(tmp_dir, ec);
    return written;
  }
  return final_dir;
}

StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& step_dir) {
  auto text = ReadWholeFile((fs::path(step_dir) / kManifestFile).string());
  if (!text.ok()) return DataLossError(step_dir + ": no readable " + kManifestFile);
  v1::CheckpointManifest m;
  google::protobuf::util::JsonParseOptions popts;
  popts.ignore_unknown_fields = true;  // newer writers may add fields
  auto parsed = google::protobuf::util::JsonStringToMessage(*text, &m, popts);
  if (!parsed.ok()) {
    return DataLossError(step_dir +
                         ": manifest is not valid JSON: " + std::string(parsed.message()));
  }
  if (m.format_version() != kManifestFormatVersion) {
    return DataLossError(step_dir + ": manifest format_version " +
                         std::to_string(m.format_version()) + ", this build reads " +
                         std::to_string(kManifestFormatVersion));
  }
  return m;
}

StatusOr<CheckpointSnapshot> ReadCheckpoint(const std::string& step_dir) {
  ReadLock lock(step_dir);
  CheckpointSnapshot snap;
  ASSIGN_OR_RETURN(snap.meta, ReadManifest(step_dir));
  const v1::CheckpointManifest& m = snap.meta;
  if (m.num_params() <= 0) return DataLossError(step_dir + ": manifest has no parameters");
  for (const auto& sh : m.shards()) {
    if (MutableArenaOf(&snap, sh.arena()) == nullptr) {
      return DataLossError(step_dir + ": shard " + sh.file() + " is of arena '" + sh.arena() +
                           "', which this build does not know (it reads params, adam_m, adam_v)");
    }
  }
  Status cov = CheckCoverage(m);
  if (!cov.ok()) return cov.WithContext(step_dir);
  for (const char* arena : kArenas) MutableArenaOf(&snap, arena)->resize(m.num_params());
  for (const auto& sh : m.shards()) {
    const std::string path = (fs::path(step_dir) / sh.file()).string();
    auto bytes = ReadWholeFile(path);
    if (!bytes.ok()) return DataLossError(step_dir + ": missing shard " + sh.file());
    const int64_t want = (sh.end() - sh.begin()) * static_cast<int64_t>(sizeof(float));
    if (static_cast<int64_t>(bytes->size()) != want || sh.bytes() != want) {
      return DataLossError(path + ": " + std::to_string(bytes->size()) + " bytes, expected " +
                           std::to_string(want));
    }
    const uint32_t crc = crc32c::Value(bytes->data(), bytes->size());
    if (crc != sh.crc32c()) {
      return DataLossError(path + ": CRC32C mismatch (file " + std::to_string(crc) + ", manifest " +
                           std::to_string(sh.crc32c()) + ")");
    }
    std::vector<float>* arena = MutableArenaOf(&snap, sh.arena());
    std::memcpy(arena->data() + sh.begin(), bytes->data(), bytes->size());
  }
  return snap;
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    bool is_tmp = false;
    int64_t step = ParseStepDir(entry.path().filename().string(), &is_tmp);
    if (step < 0 || is_tmp || !entry.is_directory(ec)) continue;
    out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

StatusOr<CheckpointSnapshot> VerifyCheckpoint(const std::string& step_dir, int64_t step) {
  auto snap = ReadCheckpoint(step_dir);
  if (snap.ok() && snap->meta.step() != step) {
    return DataLossError(step_dir + ": manifest says step " + std::to_string(snap->meta.step()));
  }
  return snap;
}

StatusOr<CheckpointSnapshot> LoadLatestCheckpoint(const std::string& dir, std::string* path) {
  const auto all = ListCheckpoints(dir);
  if (all.empty()) return NotFoundError("no checkpoint in " + dir);
  std::string why;
  for (const auto& [step, step_dir] : all) {
    auto snap = VerifyCheckpoint(step_dir, step);
    if (snap.ok()) {
      if (path != nullptr) *path = step_dir;
      return snap;
    }
    spdlog::warn("checkpoint skipped: {}", snap.status().message());
    why += "\n  " + std::string(snap.status().message());
  }
  // Starting from scratch here would overwrite what may be days of training: that must be
  // a person's explicit choice.
  return FailedPreconditionError(
      "checkpoints exist in " + dir + " but none is usable:" + why +
      "\nmove them away (or use another checkpoint.dir) to start from scratch, or pass "
      "`drover train --fresh`");
}

Status PruneCheckpoints(const std::string& dir, int keep_last) {
  auto complete = ListCheckpoints(dir);
  const int64_t newest = complete.empty() ? -1 : complete.front().first;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    bool is_tmp = false;
    int64_t step = ParseStepDir(entry.path().filename().string(), &is_tmp);
    if (is_tmp && step >= 0 && step <= newest) fs::remove_all(entry.path(), ec);
  }
  if (keep_last <= 0) return OkStatus();
  for (size_t i = static_cast<size_t>(keep_last); i < complete.size(); ++i) {
    if (!NotBeingRead(complete[i].second)) {
      spdlog::info("checkpoint {} is being read; kept past retention", complete[i].second);
      continue;
    }
    fs::remove_all(complete[i].second, ec);
    if (ec) return UnavailableError("cannot remove " + complete[i].second + ": " + ec.message());
  }
  return OkStatus();
}

}  // namespace drover::engine::ckpt
