#include "coordinator/log_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <filesystem>

#include "common/fd.h"
#include "common/mutex.h"

namespace drover::coordinator {
namespace {

// The sidecar: "<attempt> <next offset>\n", fixed width so each update is one pwrite over
// the previous one (a torn one fails to parse and only costs de-duplication).
std::string FormatNext(int64_t attempt, int64_t next) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%020lld %020lld\n", static_cast<long long>(attempt),
                static_cast<long long>(next));
  return buf;
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

int64_t LogStore::LoadNext(const std::string& job_id, int64_t attempt, int rank) const {
  ScopedFd fd(::open((PathOf(job_id, rank) + ".next").c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return 0;
  char buf[64] = {};
  if (::pread(fd.get(), buf, sizeof(buf) - 1, 0) <= 0) return 0;
  long long stored_attempt = 0, next = 0;
  if (std::sscanf(buf, "%lld %lld", &stored_attempt, &next) != 2) return 0;
  return stored_attempt == attempt && next > 0 ? next : 0;
}

Status LogStore::Append(const std::string& job_id, int64_t attempt, int rank, int64_t offset,
                        const std::string& data) {
  if (!ValidJobId(job_id)) return InvalidArgumentError("logs: invalid job id '" + job_id + "'");
  if (rank < 0 || offset < 0) return InvalidArgumentError("logs: negative rank or offset");
  MutexLock lock(&mu_);
  auto [it, inserted] = next_offset_.try_emplace({job_id, attempt, rank}, 0);
  int64_t& next = it->second;
  if (inserted) next = LoadNext(job_id, attempt, rank);  // e.g. after a coordinator restart
  const int64_t end = offset + static_cast<int64_t>(data.size());
  if (end <= next) return OkStatus();  // a retry of bytes already appended
  // Bytes before `next` were appended already; a gap (offset > next: the agent's own log
  // lost bytes, or the sidecar was torn) is accepted as is.
  const size_t skip = offset < next ? static_cast<size_t>(next - offset) : 0;
  const std::string path = PathOf(job_id, rank);
  std::error_code ec;
  std::filesystem::create_directories(root_ + "/" + job_id, ec);
  if (ec) return InternalError("logs: creating " + root_ + "/" + job_id + ": " + ec.message());
  ScopedFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoToStatus(errno, "opening " + path);
  RETURN_IF_ERROR(WriteAll(fd.get(), std::string_view(data).substr(skip), path));
  next = end;
  // Then the sidecar, so a restarted coordinator still drops a retried chunk. In this order
  // a crash between the two can at worst append a chunk twice, never lose one.
  const std::string next_path = path + ".next";
  ScopedFd side(::open(next_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  const std::string record = FormatNext(attempt, next);
  if (side.get() < 0 || ::pwrite(side.get(), record.data(), record.size(), 0) !=
                            static_cast<ssize_t>(record.size())) {
    return ErrnoToStatus(errno, "writing " + next_path);
  }
  return OkStatus();
}

Status LogStore::Remove(const std::string& job_id) {
  if (!ValidJobId(job_id)) return InvalidArgumentError("invalid job id '" + job_id + "'");
  MutexLock lock(&mu_);
  for (auto it = next_offset_.lower_bound({job_id, INT64_MIN, INT_MIN});
       it != next_offset_.end() && std::get<0>(it->first) == job_id;) {
    it = next_offset_.erase(it);
  }
  std::error_code ec;
  std::filesystem::remove_all(root_ + "/" + job_id, ec);
  if (ec) return InternalError("cannot delete the logs of job " + job_id + ": " + ec.message());
  return OkStatus();
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
