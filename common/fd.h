// Low-level file-descriptor helpers shared by common/files.cc and common/token_shard.cc.
#pragma once

#include <unistd.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace drover {

// Owns a file descriptor and closes it on scope exit (for the error paths). Close()
// reports the close(2) error, which matters after writes (NFS reports failed writes there).
// Not thread-safe.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;

  int get() const { return fd_; }
  // Closes now; returns close(2)'s result (-1 with errno set on failure).
  int Close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  // Gives the descriptor up without closing it (another owner takes it).
  void Forget() { fd_ = -1; }
  // Closes the current descriptor (if any) and owns `fd` instead.
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// Writes all of `data` to `fd`, retrying short writes and EINTR; errors name `path`.
Status WriteAll(int fd, std::string_view data, const std::string& path);

// Reads exactly `bytes` at `offset` (pread: the descriptor's position does not matter),
// retrying short reads and EINTR; DataLoss naming `path` if the file ends first.
Status ReadAllAt(int fd, void* data, size_t bytes, uint64_t offset, const std::string& path);

}  // namespace drover
