#include "coordinator/log_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>

namespace drover::coordinator {
namespace {

Status WriteAll(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "appending to " + path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

}  // namespace

LogStore::LogStore(std::string root) : root_(std::move(root)) {}

bool LogStore::ValidJobId(const std::string& job_id) {
  if (job_id.empty() || job_id.size() > 128 || job_id == "." || job_id == "..") return false;
  return std::all_of(job_id.begin(), job_id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::string LogStore::PathOf(const std::string& job_id, int rank) const {
  return root_ + "/" + job_id + "/rank-" + std::to_string(rank) + ".log";
}

Status LogStore::Append(const std::string& job_id, int64_t attempt, int rank, int64_t offset,
                        const std::string& data) {
  if (!ValidJobId(job_id)) return InvalidArgumentError("logs: invalid job id '" + job_id + "'");
  if (rank < 0 || offset < 0) return InvalidArgumentError("logs: negative rank or offset");
  std::lock_guard<std::mutex> lock(mu_);
  int64_t& next = next_offset_[{job_id, attempt, rank}];
  const int64_t end = offset + static_cast<int64_t>(data.size());
  if (end <= next) return OkStatus();  // a retry of bytes already appended
  // Bytes before `next` were appended already; a gap (offset > next, e.g. after a
  // coordinator restart lost `next`) is accepted as is.
  const size_t skip = offset < next ? static_cast<size_t>(next - offset) : 0;
  const std::string path = PathOf(job_id, rank);
  std::error_code ec;
  std::filesystem::create_directories(root_ + "/" + job_id, ec);
  if (ec) return InternalError("logs: creating " + root_ + "/" + job_id + ": " + ec.message());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "opening " + path);
  Status st = WriteAll(fd, data.data() + skip, data.size() - skip, path);
  ::close(fd);
  if (st.ok()) next = end;
  return st;
}

StatusOr<LogStore::Chunk> LogStore::Read(const std::string& job_id, int rank, int64_t offset,
                                         int64_t max_bytes) {
  if (!ValidJobId(job_id)) return InvalidArgumentError("logs: invalid job id '" + job_id + "'");
  if (rank < 0 || offset < 0) return InvalidArgumentError("logs: negative rank or offset");
  max_bytes = std::clamp<int64_t>(max_bytes <= 0 ? 1 << 20 : max_bytes, 1, 4 << 20);
  Chunk chunk;
  chunk.next_offset = offset;
  const std::string path = PathOf(job_id, rank);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return chunk;
    return ErrnoToStatus(errno, "opening " + path);
  }
  chunk.data.resize(static_cast<size_t>(max_bytes));
  ssize_t n;
  do {
    n = ::pread(fd, chunk.data.data(), chunk.data.size(), offset);
  } while (n < 0 && errno == EINTR);
  int err = errno;
  ::close(fd);
  if (n < 0) return ErrnoToStatus(err, "reading " + path);
  chunk.data.resize(static_cast<size_t>(n));
  chunk.next_offset = offset + n;
  return chunk;
}

}  // namespace drover::coordinator
