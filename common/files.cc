#include "common/files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <system_error>

#include "common/fd.h"

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

namespace {

Status FsyncPath(const std::string& path, int flags, const char* what) {
  ScopedFd fd(::open(path.c_str(), flags | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, std::string("open ") + what + " " + path);
  if (::fsync(fd.get()) != 0)
    return ErrnoToStatus(errno, std::string("fsync ") + what + " " + path);
  return OkStatus();
}

// A name no other writer (thread or process) will pick: pid plus a process-wide counter.
std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace

std::string Dirname(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

StatusOr<std::string> ReadFileToString(const std::string& path) {
  return ReadFileTail(path, std::numeric_limits<size_t>::max());
}

StatusOr<std::string> ReadFileTail(const std::string& path, size_t max_bytes) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoToStatus(errno, "open " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
  if (S_ISDIR(st.st_mode)) return ErrnoToStatus(EISDIR, "read " + path);
  const size_t size = static_cast<size_t>(std::max<off_t>(st.st_size, 0));
  if (size > max_bytes && ::lseek(fd.get(), static_cast<off_t>(size - max_bytes), SEEK_SET) < 0) {
    return ErrnoToStatus(errno, "seek " + path);
  }
  std::string out;
  out.reserve(std::min(size, max_bytes));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status WriteFileAtomic(const std::string& path, std::string_view data) {
  const std::string tmp = TempPathFor(path);
  ScopedFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoToStatus(errno, "create " + tmp);
  Status st = WriteAll(fd.get(), data, tmp);
  // The data must be durable before the rename makes it visible under `path`; otherwise a
  // crash could leave `path` naming an empty or partial file.
  if (st.ok() && ::fsync(fd.get()) != 0) st = ErrnoToStatus(errno, "fsync " + tmp);
  if (fd.Close() != 0 && st.ok()) st = ErrnoToStatus(errno, "close " + tmp);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = ErrnoToStatus(errno, "rename " + tmp + " to " + path);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return FsyncDir(Dirname(path));
}

Status FsyncDir(const std::string& dir) { return FsyncPath(dir, O_RDONLY | O_DIRECTORY, "dir"); }

Status FsyncFile(const std::string& path) { return FsyncPath(path, O_RDONLY, "file"); }

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
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    if (err == ENOTEMPTY) {
      return FailedPreconditionError("rename " + from + " to " + to + ": " + to +
                                     " is a non-empty directory");
    }
    return ErrnoToStatus(err, "rename " + from + " to " + to);
  }
  const std::string to_dir = Dirname(to);
  RETURN_IF_ERROR(FsyncDir(to_dir));
  const std::string from_dir = Dirname(from);
  if (from_dir != to_dir) RETURN_IF_ERROR(FsyncDir(from_dir));
  return OkStatus();
}

}  // namespace drover
