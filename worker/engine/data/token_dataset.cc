#include "worker/engine/data/token_dataset.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/token_shard.h"

namespace drover::engine {
namespace {

// Paths matching `pattern`, sorted. A pattern with no wildcard that names a missing file is
// NotFound too (glob(3) returns it only if it exists, with GLOB_NOCHECK unset).
StatusOr<std::vector<std::string>> MatchShards(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    return NotFoundError("no token shard matches '" + pattern + "'");
  }
  if (rc != 0) return UnavailableError("cannot list '" + pattern + "' (glob error)");
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(const std::string& pattern,
                                                           int seq_len) {
  if (seq_len < 1) {
    return InvalidArgumentError("sequence length must be >= 1, got " + std::to_string(seq_len));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> paths, MatchShards(pattern));
  std::unique_ptr<TokenDataset> ds(new TokenDataset());
  ds->seq_len_ = seq_len;
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "token shard " + path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "stat " + path);
    }
    const auto size = static_cast<size_t>(st.st_size);
    if (size < kTokenShardHeaderBytes) {
      ::close(fd);
      return DataLossError("token shard " + path + ": file is " + std::to_string(size) +
                           " bytes, shorter than the header");
    }
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    const int map_err = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (map == MAP_FAILED) return ErrnoToStatus(map_err, "mmap " + path);
    Shard shard;
    shard.path = path;
    shard.map = map;
    shard.map_bytes = size;
    // Registered before validation so the destructor unmaps it on every error path.
    ds->shards_.push_back(shard);
    ASSIGN_OR_RETURN(const uint64_t count,
                     CheckTokenShardHeader(static_cast<const int32_t*>(map), size, path));
    Shard& s = ds->shards_.back();
    s.count = count;
    s.tokens =
        reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kTokenShardHeaderBytes);
    // Windows start at 0, T, 2T, ... and need T + 1 tokens.
    s.windows = count >= 1 ? (count - 1) / static_cast<uint64_t>(seq_len) : 0;
    s.first_window = ds->num_windows_;
    ds->num_windows_ += s.windows;
    ds->num_tokens_ += count;
  }
  if (ds->num_windows_ == 0) {
    return InvalidArgumentError(
        "token shards '" + pattern + "' hold " + std::to_string(ds->num_tokens_) +
        " tokens, too few for one window of seq_len + 1 = " + std::to_string(seq_len + 1) +
        " tokens in any shard");
  }
  return ds;
}

TokenDataset::~TokenDataset() {
  for (const Shard& s : shards_) ::munmap(s.map, s.map_bytes);
}

void TokenDataset::WindowStart(uint64_t w, size_t* shard, uint64_t* token) const {
  DROVER_CHECK(w < num_windows_);
  // The last shard whose first window is <= w. A shard without windows shares its
  // first_window with its successor, so it is never the last such shard.
  auto it = std::upper_bound(shards_.begin(), shards_.end(), w,
                             [](uint64_t x, const Shard& s) { return x < s.first_window; });
  DROVER_CHECK(it != shards_.begin());
  --it;
  DROVER_CHECK(w < it->first_window + it->windows);
  *shard = static_cast<size_t>(it - shards_.begin());
  *token = (w - it->first_window) * static_cast<uint64_t>(seq_len_);
}

Status TokenDataset::CheckTokens(size_t s, uint64_t first, uint64_t count, int vocab_size) const {
  if (vocab_size <= 0) return OkStatus();
  const Shard& shard = shards_[s];
  DROVER_CHECK(first + count <= shard.count);
  const uint16_t* tok = shard.tokens + first;
  uint16_t max = 0;
  for (uint64_t i = 0; i < count; ++i) max = std::max(max, tok[i]);
  if (max < vocab_size) return OkStatus();
  const uint64_t at =
      first +
      static_cast<uint64_t>(
          std::find_if(tok, tok + count, [&](uint16_t t) { return t >= vocab_size; }) - tok);
  return InvalidArgumentError("shard " + shard.path + " has token id " +
                              std::to_string(shard.tokens[at]) + " at token " + std::to_string(at) +
                              ", but model.vocab_size is " + std::to_string(vocab_size));
}

void TokenDataset::ReadWindow(uint64_t w, int32_t* inputs, int32_t* targets) const {
  size_t s = 0;
  uint64_t start = 0;
  WindowStart(w, &s, &start);
  const uint16_t* tok = shards_[s].tokens + start;
  for (int t = 0; t < seq_len_; ++t) {
    inputs[t] = tok[t];
    targets[t] = tok[t + 1];
  }
}

}  // namespace drover::engine
