// Token shards in llm.c / nanoGPT format.
//
//   header: 256 x int32 (little-endian): [0] = 20240520 (magic), [1] = 1 (version),
//           [2] = number of tokens; the rest zero
//   body:   that many uint16 tokens
//
// A file whose size is not exactly header + 2 * count bytes is rejected (truncated or
// trailing garbage), so a half-written shard never feeds a training run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/file_system.h"
#include "common/status.h"

namespace drover {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr size_t kTokenShardHeaderInts = 256;
inline constexpr size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);

// Checks a shard header against the file it came from. Returns the token count, or
// DataLoss naming `path` for a bad magic or version, a negative count, or a `file_size`
// other than header + 2 * count bytes (the message gives expected and actual sizes).
StatusOr<uint64_t> CheckTokenShardHeader(const int32_t* header, uint64_t file_size,
                                         const std::string& path);

// Writes `tokens` as a shard at `path` with WriteFileAtomic, so readers never see a partial
// file and a failed write leaves no temporary file. Errors name the path.
Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens,
                       FileSystem* fs = FileSystem::Default());

// Reads and validates the header only; returns the token count.
StatusOr<uint64_t> ReadTokenShardCount(const std::string& path);

// Reads a whole shard into memory. NotFound / DataLoss name the path.
StatusOr<std::vector<uint16_t>> ReadTokenShard(const std::string& path);

}  // namespace drover
