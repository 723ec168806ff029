#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "common/file_system.h"
#include "common/files.h"
#include "common/mutex.h"
#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/ckpt/checkpoint_format.h"

// Reading checkpoints (checkpoint.h): manifests, whole snapshots and the parts a rank needs,
// each file verified, and the newest usable checkpoint of a directory. Writing is
// checkpoint.cc.
namespace drover::engine::ckpt {
namespace {

using internal::CheckCoverage;
using internal::Join;
using internal::kArenas;
using internal::kBlockBytes;
using internal::kMaxBlockBytes;
using internal::ReadLock;
using internal::RunsOf;
using internal::RunsSize;

// The part holding arena `name`; null for a name this build does not know.
GlobalPart* PartOf(CheckpointPart* p, const std::string& name) {
  if (name == "params") return &p->params;
  if (name == "adam_m") return &p->adam_m;
  if (name == "adam_v") return &p->adam_v;
  return nullptr;
}

}  // namespace

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
  RETURN_IF_ERROR(internal::CheckManifestSeal(Join(step_dir, kManifestFile), *text, m));
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

// What to read of one shard file for a part, found (and the file's size checked) before any
// shard is read, so that a restore knows its total and a missing file stops it at once.
struct ShardRead {
  const v1::CheckpointShard* sh = nullptr;
  std::string path;
  GlobalPart* part = nullptr;
  std::vector<FilePiece> pieces;  // the file's elements, in file order
  std::vector<FileSpan> spans;    // the blocks to read (SpansToRead)
  bool whole = false;             // every byte of the file is read
  uint64_t bytes = 0;             // of the spans
};

// The plan for reading shard `sh` into `part`: checks the file's size against the manifest's
// runs and byte count (DataLoss naming the file when either disagrees).
StatusOr<ShardRead> PlanShardRead(const std::string& step_dir, const v1::CheckpointShard& sh,
                                  GlobalPart* part) {
  ShardRead plan;
  plan.sh = &sh;
  plan.path = Join(step_dir, sh.file());
  plan.part = part;
  const std::vector<v1::CheckpointRun> runs = RunsOf(sh);
  const int64_t want = RunsSize(runs) * static_cast<int64_t>(sizeof(float));
  // Two different disagreements, each with its own pair of numbers: one message for both
  // printed the same number twice when the manifest's byte count was the wrong one.
  std::error_code ec;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(plan.path, ec));
  if (ec) return DataLossError(step_dir + ": missing shard " + sh.file());
  if (size != want) {
    return DataLossError(plan.path + ": the file is " + std::to_string(size) +
                         " bytes, the manifest's runs cover " + std::to_string(want));
  }
  if (sh.bytes() != want) {
    return DataLossError(plan.path + ": the manifest says " + std::to_string(sh.bytes()) +
                         " bytes, but its runs cover " + std::to_string(want));
  }
  size_t at = 0;
  ForEachPiece(runs, [&](size_t b, size_t e) {
    plan.pieces.push_back({b, at, e - b});
    at += e - b;
  });
  plan.spans = SpansToRead(sh, plan.pieces, *part);
  plan.whole = plan.spans.size() == 1 && plan.spans[0].offset == 0 &&
               plan.spans[0].length == static_cast<uint64_t>(want);
  for (const FileSpan& s : plan.spans) plan.bytes += s.length;
  return plan;
}

// Reads the blocks `plan` names (the whole file when it has no block checksums), verifies
// each block's CRC32C (the whole file's too when every block is read), and copies the
// elements the part holds into it as they stream past, adding their number to *copied and
// the bytes read to *bytes_read; `on_chunk` is told of each chunk's bytes as it is read (a
// block that fails its CRC fails the whole read, so what was copied is never used). Shards
// of one checkpoint cover disjoint elements, so they may be read into one part concurrently.
Status ReadShardInto(const ShardRead& plan, std::atomic<size_t>* copied,
                     std::atomic<int64_t>* bytes_read,
                     const std::function<void(size_t bytes)>& on_chunk) {
  const v1::CheckpointShard& sh = *plan.sh;
  const std::string& path = plan.path;
  const std::vector<FilePiece>& pieces = plan.pieces;
  GlobalPart* part = plan.part;
  const bool whole = plan.whole;
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
    on_chunk(bytes);
    return OkStatus();
  };
  StatusOr<size_t> read = ReadFileSpansInChunks(path, plan.spans, chunk, scatter);
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
                                            const PartRequestFn& want,
                                            const ReadProgressFn& progress) {
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
  std::vector<ShardRead> plans;
  uint64_t total = 0;
  for (const v1::CheckpointShard& sh : m.shards()) {
    GlobalPart* into = PartOf(&part, sh.arena());
    if (!HoldsSomeOf(RunsOf(sh), *into)) continue;
    ASSIGN_OR_RETURN(ShardRead plan, PlanShardRead(step_dir, sh, into));
    total += plan.bytes;
    plans.push_back(std::move(plan));
  }
  const int count = static_cast<int>(plans.size());
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  std::vector<Status> results(plans.size());
  std::atomic<size_t> copied{0};
  std::atomic<int64_t> bytes_read{0};
  Mutex progress_mu;
  uint64_t done = 0;  // guarded by progress_mu: the bytes read so far, for `progress`
  auto on_chunk = [&](size_t bytes) {
    if (!progress) return;
    MutexLock lock(&progress_mu);
    done += bytes;
    progress(step_dir, static_cast<int64_t>(done), static_cast<int64_t>(total));
  };
  if (progress) progress(step_dir, 0, static_cast<int64_t>(total));
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i = next++; i < count; i = next++) {
      const auto k = static_cast<size_t>(i);
      results[k] = ReadShardInto(plans[k], &copied, &bytes_read, on_chunk);
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

StatusOr<CheckpointSnapshot> VerifyCheckpoint(const std::string& step_dir, int64_t step) {
  return ReadWhole(step_dir, step);
}

StatusOr<CheckpointSnapshot> LoadLatestCheckpoint(const std::string& dir, std::string* path) {
  return LoadNewest<CheckpointSnapshot>(dir, VerifyCheckpoint, path);
}

StatusOr<CheckpointPart> LoadLatestCheckpointPart(const std::string& dir, const PartRequestFn& want,
                                                  std::string* path,
                                                  const ReadProgressFn& progress) {
  return LoadNewest<CheckpointPart>(
      dir,
      [&](const std::string& step_dir, int64_t step) {
        return ReadCheckpointPart(step_dir, step, want, progress);
      },
      path);
}

}  // namespace drover::engine::ckpt
