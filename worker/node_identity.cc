#include "worker/node_identity.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>

#include "common/files.h"

namespace drover {

StatusOr<std::string> LoadOrCreateNodeUid(const std::string& work_dir) {
  const std::string path = work_dir + "/node_uid";
  if (PathExists(path)) {
    ASSIGN_OR_RETURN(std::string uid, ReadFileToString(path));
    while (!uid.empty() && (uid.back() == '\n' || uid.back() == ' ')) uid.pop_back();
    if (uid.empty()) return DataLossError(path + " is empty; remove it to make a new node id");
    return uid;
  }
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  RETURN_IF_ERROR(WriteFileAtomic(path, std::string(buf) + "\n"));
  return std::string(buf);
}

Status LockWorkDir(const std::string& work_dir) {
  const std::string path = work_dir + "/agent.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPreconditionError("another drover-worker runs with --work-dir " + work_dir +
                                     " (it holds " + path + "); give each agent its own work dir");
    }
    return ErrnoToStatus(err, "lock " + path);
  }
  return OkStatus();  // fd stays open: the lock lasts as long as the process
}

}  // namespace drover
