// A read-only, memory-mapped view of every token shard matching a glob.
//
// Shards are ordered by path (glob(3) sorts), so a pattern names the same token stream on
// every rank and every run. For a sequence length T the dataset is cut into *windows* of
// T + 1 tokens that start at multiples of T inside each shard (llm.c's sequential
// windows: inputs are the first T tokens, targets the last T) and never cross a shard
// boundary; window w of the whole dataset is window w - first(s) of its shard s.
//
// Thread-safety: immutable after Open; any thread may read concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace drover::engine {

class TokenDataset {
 public:
  // Maps every shard matching `pattern` (a path or a glob) and prepares windows of
  // seq_len + 1 tokens. NotFound if nothing matches; DataLoss naming the file for a bad
  // shard; InvalidArgument if seq_len < 1 or no shard holds even one window.
  static StatusOr<std::unique_ptr<TokenDataset>> Open(const std::string& pattern, int seq_len);

  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int seq_len() const { return seq_len_; }
  size_t num_shards() const { return shards_.size(); }
  const std::string& shard_path(size_t s) const { return shards_[s].path; }
  uint64_t shard_tokens(size_t s) const { return shards_[s].count; }
  // The tokens of shard s (shard_tokens(s) of them), valid for the dataset's lifetime.
  const uint16_t* shard_data(size_t s) const { return shards_[s].tokens; }
  uint64_t num_tokens() const { return num_tokens_; }

  // Windows of seq_len + 1 tokens over all shards.
  uint64_t num_windows() const { return num_windows_; }

  // Copies window w as int32: inputs[0..T) = tokens[start, start+T),
  // targets[0..T) = tokens[start+1, start+T+1). CHECKs w < num_windows().
  void ReadWindow(uint64_t w, int32_t* inputs, int32_t* targets) const;

  // The (shard, first token) of window w. CHECKs w < num_windows().
  void WindowStart(uint64_t w, size_t* shard, uint64_t* token) const;

  // InvalidArgument naming the shard, the position and the id of the first token among
  // [first, first + count) of shard s that is not below vocab_size; OK when there is none
  // (or vocab_size <= 0). The loaders check each batch as they assemble it, so that no
  // start-up has to read the whole data set to validate it.
  Status CheckTokens(size_t s, uint64_t first, uint64_t count, int vocab_size) const;

 private:
  struct Shard {
    std::string path;
    const uint16_t* tokens = nullptr;  // into the mapping, after the header
    uint64_t count = 0;
    void* map = nullptr;
    size_t map_bytes = 0;
    uint64_t first_window = 0;  // global index of this shard's first window
    uint64_t windows = 0;
  };

  TokenDataset() = default;

  int seq_len_ = 0;
  std::vector<Shard> shards_;
  uint64_t num_tokens_ = 0;
  uint64_t num_windows_ = 0;
};

}  // namespace drover::engine
