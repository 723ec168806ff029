#include "worker/engine/ckpt/checkpoint_format.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <sys/file.h>
#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <string_view>

#include "common/crc32c.h"

namespace drover::engine::ckpt::internal {

namespace {

// The seal's digits while its CRC is computed: the largest uint32, so that the JSON printer
// writes the field (it leaves zeros out).
constexpr uint32_t kSealPlaceholder = 4294967295u;
constexpr std::string_view kSealDigits = "4294967295";

// Where the seal's digits stand in `text`: [*begin, *end); false when it has none. Both of
// the JSON names a parser takes count (a rewritten manifest may use the camel-case one); a
// key inside a string value cannot match, since its quotes would be escaped there.
bool FindSeal(std::string_view text, size_t* begin, size_t* end, int* count) {
  *count = 0;
  for (std::string_view key : {"\"manifest_crc32c\"", "\"manifestCrc32c\""}) {
    for (size_t at = text.find(key); at != std::string_view::npos; at = text.find(key, at + 1)) {
      size_t p = at + key.size();
      while (p < text.size() && (text[p] == ' ' || text[p] == ':')) ++p;
      size_t q = p;
      while (q < text.size() && text[q] >= '0' && text[q] <= '9') ++q;
      *begin = p;
      *end = q;
      ++*count;
    }
  }
  return *count > 0;
}

// CRC32C of `text` with [begin, end) read as the placeholder's digits.
uint32_t SealOf(std::string_view text, size_t begin, size_t end) {
  uint32_t crc = crc32c::Extend(0, text.data(), begin);
  crc = crc32c::Extend(crc, kSealDigits.data(), kSealDigits.size());
  return crc32c::Extend(crc, text.data() + end, text.size() - end);
}

}  // namespace

StatusOr<std::string> SealManifest(const v1::CheckpointManifest& manifest) {
  v1::CheckpointManifest m = manifest;
  m.set_manifest_crc32c(kSealPlaceholder);
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &json, opts).ok()) {
    return InternalError("cannot encode checkpoint manifest as JSON");
  }
  size_t begin = 0, end = 0;
  int count = 0;
  if (!FindSeal(json, &begin, &end, &count) || count != 1 ||
      std::string_view(json).substr(begin, end - begin) != kSealDigits) {
    return InternalError("the checkpoint manifest's JSON has no place for its seal");
  }
  return json.substr(0, begin) + std::to_string(SealOf(json, begin, end)) + json.substr(end);
}

Status CheckManifestSeal(const std::string& path, const std::string& text,
                         const v1::CheckpointManifest& m) {
  size_t begin = 0, end = 0;
  int count = 0;
  if (!FindSeal(text, &begin, &end, &count)) {
    if (m.format_version() < 3) return OkStatus();
    return DataLossError(path + ": the manifest of format " + std::to_string(m.format_version()) +
                         " has no seal (manifest_crc32c): it is damaged");
  }
  if (count != 1) return DataLossError(path + ": the manifest has more than one seal");
  const uint32_t want = SealOf(text, begin, end);
  if (m.manifest_crc32c() != want) {
    return DataLossError(path + ": the manifest does not match its seal (it says " +
                         std::to_string(m.manifest_crc32c()) + ", its text gives " +
                         std::to_string(want) + "): it is damaged");
  }
  return OkStatus();
}

std::string Join(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

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

ReadLock::ReadLock(const std::string& step_dir)
    : fd_(::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  if (fd_ >= 0) (void)::flock(fd_, LOCK_SH);
}

ReadLock::~ReadLock() {
  if (fd_ >= 0) ::close(fd_);
}

bool NotBeingRead(const std::string& step_dir) {
  int fd = ::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return true;
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

}  // namespace drover::engine::ckpt::internal
