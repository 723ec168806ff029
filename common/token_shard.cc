#include "common/token_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "common/fd.h"

namespace drover {
namespace {

// Opens `path` and validates its header; returns the token count and keeps the fd open.
StatusOr<uint64_t> OpenAndCheck(const std::string& path, ScopedFd* fd) {
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) return ErrnoToStatus(errno, "token shard " + path);
  fd->reset(raw);
  struct stat st;
  if (::fstat(raw, &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < kTokenShardHeaderBytes) {
    return DataLossError("token shard " + path + ": file is " + std::to_string(size) +
                         " bytes, shorter than the " + std::to_string(kTokenShardHeaderBytes) +
                         "-byte header");
  }
  int32_t header[kTokenShardHeaderInts];
  RETURN_IF_ERROR(ReadAllAt(raw, header, sizeof(header), 0, path));
  return CheckTokenShardHeader(header, size, path);
}

}  // namespace

StatusOr<uint64_t> CheckTokenShardHeader(const int32_t* header, uint64_t file_size,
                                         const std::string& path) {
  if (header[0] != kTokenShardMagic) {
    return DataLossError("token shard " + path + ": bad magic " + std::to_string(header[0]) +
                         ", expected " + std::to_string(kTokenShardMagic) +
                         " (not an llm.c token shard?)");
  }
  if (header[1] != kTokenShardVersion) {
    return DataLossError("token shard " + path + ": unsupported version " +
                         std::to_string(header[1]) + ", expected " +
                         std::to_string(kTokenShardVersion) + " (uint16 tokens)");
  }
  if (header[2] < 0) {
    return DataLossError("token shard " + path + ": negative token count " +
                         std::to_string(header[2]));
  }
  const auto count = static_cast<uint64_t>(header[2]);
  const uint64_t expected = kTokenShardHeaderBytes + count * sizeof(uint16_t);
  if (file_size != expected) {
    return DataLossError("token shard " + path + ": header says " + std::to_string(count) +
                         " tokens, so the file should be " + std::to_string(expected) +
                         " bytes, but it is " + std::to_string(file_size) + " bytes" +
                         (file_size < expected ? " (truncated)" : " (trailing data)"));
  }
  return count;
}

Status WriteTokenShard(const std::string& path, std::span<const uint16_t> tokens, FileSystem* fs) {
  // The count is an int32 in the header: llm.c's format caps a shard at 2^31 - 1 tokens.
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgumentError("token shard " + path + ": " + std::to_string(tokens.size()) +
                                " tokens exceed the format's limit of 2147483647");
  }
  int32_t header[kTokenShardHeaderInts] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());

  return WriteFileAtomic(fs, path, [&](WritableFile& file) {
    RETURN_IF_ERROR(
        file.Append(std::string_view(reinterpret_cast<const char*>(header), sizeof(header))));
    return file.Append(
        std::string_view(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes()));
  });
}

StatusOr<uint64_t> ReadTokenShardCount(const std::string& path) {
  ScopedFd fd(-1);
  return OpenAndCheck(path, &fd);
}

StatusOr<std::vector<uint16_t>> ReadTokenShard(const std::string& path) {
  ScopedFd fd(-1);
  ASSIGN_OR_RETURN(const uint64_t count, OpenAndCheck(path, &fd));
  std::vector<uint16_t> tokens(count);
  RETURN_IF_ERROR(
      ReadAllAt(fd.get(), tokens.data(), count * sizeof(uint16_t), kTokenShardHeaderBytes, path));
  return tokens;
}

}  // namespace drover
