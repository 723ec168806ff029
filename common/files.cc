#include "common/files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <system_error>
#include <vector>

#include "common/fd.h"
#include "common/file_system.h"

namespace drover {

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write " + path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return OkStatus();
}

Status ReadAllAt(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read " + path);
    }
    if (n == 0) return DataLossError(path + ": unexpected end of file");
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return OkStatus();
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  return ReadFileTail(path, std::numeric_limits<size_t>::max());
}

namespace {

// Reads `fd` from byte `offset` until `limit` bytes or its end, whichever comes first, for
// ReadFileInChunks, ReadFileSpansInChunks and ReadFileTail (`path` names it in errors); fn
// gets each piece's file offset. pread, so that the descriptor's position does not matter;
// a pipe (a spec given as <(...)) cannot pread, and is read in order from its start.
StatusOr<size_t> ReadChunks(
    int fd, const std::string& path, uint64_t offset, uint64_t limit, size_t chunk,
    const std::function<Status(uint64_t at, const char* data, size_t n)>& fn,
    std::vector<char>& buf) {
  DROVER_CHECK(chunk > 0);
  buf.resize(chunk);
  size_t total = 0;
  bool in_order = false;  // read(2) from here on: `fd` does not seek
  for (bool end = false; !end && total < limit;) {
    // Fill the buffer (read may return less than asked), so that every piece but the last
    // is whole: a reader of fixed-size records never sees one split between two pieces.
    const size_t want = static_cast<size_t>(std::min<uint64_t>(chunk, limit - total));
    size_t filled = 0;
    while (filled < want) {
      const ssize_t n = in_order ? ::read(fd, buf.data() + filled, want - filled)
                                 : ::pread(fd, buf.data() + filled, want - filled,
                                           static_cast<off_t>(offset + total + filled));
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == ESPIPE && offset == 0 && total + filled == 0) {
          in_order = true;
          continue;
        }
        return ErrnoToStatus(errno, "read " + path);
      }
      if (n == 0) {
        end = true;
        break;
      }
      filled += static_cast<size_t>(n);
    }
    if (filled == 0) break;
    RETURN_IF_ERROR(fn(offset + total, buf.data(), filled));
    total += filled;
  }
  return total;
}

}  // namespace

StatusOr<size_t> ReadFileInChunks(const std::string& path, size_t chunk,
                                  const std::function<Status(const char* data, size_t n)>& fn) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, "open " + path);
  std::vector<char> buf;
  return ReadChunks(
      fd.get(), path, 0, std::numeric_limits<uint64_t>::max(), chunk,
      [&](uint64_t, const char* data, size_t n) { return fn(data, n); }, buf);
}

StatusOr<size_t> ReadFileSpansInChunks(
    const std::string& path, const std::vector<FileSpan>& spans, size_t chunk,
    const std::function<Status(uint64_t offset, const char* data, size_t n)>& fn) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, "open " + path);
  std::vector<char> buf;
  size_t total = 0;
  for (const FileSpan& span : spans) {
    ASSIGN_OR_RETURN(size_t got,
                     ReadChunks(fd.get(), path, span.offset, span.length, chunk, fn, buf));
    total += got;
    if (got < span.length) {
      return OutOfRangeError("read " + path + ": the file ends at byte " +
                             std::to_string(span.offset + got) + ", before the end of bytes [" +
                             std::to_string(span.offset) + ", " +
                             std::to_string(span.offset + span.length) + ")");
    }
  }
  return total;
}

StatusOr<std::string> ReadFileTail(const std::string& path, size_t max_bytes) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, "open " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  if (S_ISDIR(st.st_mode)) return ErrnoToStatus(EISDIR, "read " + path);
  const size_t size = static_cast<size_t>(std::max<off_t>(st.st_size, 0));
  std::string out;
  out.reserve(std::min(size, max_bytes));
  auto append = [&](uint64_t, const char* data, size_t n) {
    out.append(data, n);
    return OkStatus();
  };
  std::vector<char> buf;
  RETURN_IF_ERROR(ReadChunks(fd.get(), path, size > max_bytes ? size - max_bytes : 0,
                             std::numeric_limits<uint64_t>::max(), size_t{1} << 16, append, buf)
                      .status());
  return out;
}

Status WriteFileAtomic(const std::string& path, std::string_view data) {
  return WriteFileAtomic(FileSystem::Default(), path, data);
}

Status FsyncDir(const std::string& dir) { return FileSystem::Default()->SyncDir(dir); }

Status FsyncFile(const std::string& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, "open file " + path);
  if (::fsync(fd.get()) != 0) return ErrnoToStatus(errno, "fsync file " + path);
  return OkStatus();
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return InvalidArgumentError("MakeDirs: empty path");
  if (IsDirectory(path)) return OkStatus();
  const std::string parent = Dirname(path);
  if (parent != path && parent != "." && parent != "/") RETURN_IF_ERROR(MakeDirs(parent));
  if (::mkdir(path.c_str(), 0755) == 0) return OkStatus();
  const int err = errno;
  // Another process may have created it between our check and mkdir: that is success.
  if (err == EEXIST && IsDirectory(path)) return OkStatus();
  if (err == EEXIST)
    return FailedPreconditionError("mkdir " + path + ": exists and is not a directory");
  return ErrnoToStatus(err, "mkdir " + path);
}

Status RemoveAll(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoToStatus(ec.value(), "remove " + path);
  return OkStatus();
}

StatusOr<std::string> MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + prefix;
  path += "XXXXXX";
  if (::mkdtemp(path.data()) == nullptr) return ErrnoToStatus(errno, "mkdtemp " + path);
  return path;
}

StatusOr<std::vector<std::string>> ListGlob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc == GLOB_NOSPACE) return ResourceExhaustedError("glob " + pattern + ": out of memory");
  if (rc == GLOB_ABORTED)
    return InternalError("glob " + pattern + ": a directory could not be read");
  std::sort(paths.begin(), paths.end());  // glob sorts by locale; we want byte order
  return paths;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status RenameAtomic(const std::string& from, const std::string& to) {
  return RenameAtomic(FileSystem::Default(), from, to);
}

}  // namespace drover
