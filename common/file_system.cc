#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "common/fd.h"
#include "common/files.h"

namespace drover {
namespace {

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  Status Append(std::string_view data) override { return WriteAll(fd_.get(), data, path_); }
  Status Sync() override {
    if (::fsync(fd_.get()) != 0) return ErrnoToStatus(errno, "fsync " + path_);
    return OkStatus();
  }
  Status Close() override {
    if (fd_.get() < 0) return OkStatus();
    if (fd_.Close() != 0) return ErrnoToStatus(errno, "close " + path_);
    return OkStatus();
  }
  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  ScopedFd fd_;
};

class PosixFileSystem final : public FileSystem {
 public:
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(errno, "create " + path);
    return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(path, fd));
  }

  StatusOr<std::string> ReadFile(const std::string& path) override {
    return ReadFileToString(path);
  }

  StatusOr<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat " + path);
    return FileInfo{static_cast<uint64_t>(std::max<off_t>(st.st_size, 0)), S_ISDIR(st.st_mode)};
  }

  StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return ErrnoToStatus(errno, "list " + dir);
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      const std::string_view name = e->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int err = errno;
    ::closedir(d);
    if (err != 0) return ErrnoToStatus(err, "list " + dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) == 0) return OkStatus();
    const int err = errno;
    if (err == ENOTEMPTY) {
      return FailedPreconditionError("rename " + from + " to " + to + ": " + to +
                                     " is a non-empty directory");
    }
    return ErrnoToStatus(err, "rename " + from + " to " + to);
  }

  Status SyncDir(const std::string& dir) override {
    ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoToStatus(errno, "open dir " + dir);
    if (::fsync(fd.get()) != 0) return ErrnoToStatus(errno, "fsync dir " + dir);
    return OkStatus();
  }

  Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return ErrnoToStatus(errno, "remove " + path);
    return OkStatus();
  }

  Status RemoveAll(const std::string& path) override { return drover::RemoveAll(path); }
  Status MakeDirs(const std::string& path) override { return drover::MakeDirs(path); }
};

// A name no other writer (thread or process) will pick: pid plus a process-wide counter.
std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

FileWriter WriterOf(std::string_view data) {
  return [data](WritableFile& file) { return file.Append(data); };
}

}  // namespace

FileSystem* FileSystem::Default() {
  // Leaked on purpose: writers on detached threads may still use it during static destruction.
  static FileSystem* const fs = new PosixFileSystem;
  return fs;
}

Status WriteFileSynced(FileSystem* fs, const std::string& path, const FileWriter& write) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  Status st = write(*file);
  // Synced before the caller can make the name visible (rename, directory fsync): otherwise
  // a crash could leave a published name on an empty or partial file.
  if (st.ok()) st = file->Sync();
  Status closed = file->Close();
  if (st.ok()) st = closed;
  if (!st.ok()) (void)fs->RemoveFile(path);  // best effort: the first error is the news
  return st;
}

Status WriteFileSynced(FileSystem* fs, const std::string& path, std::string_view data) {
  return WriteFileSynced(fs, path, WriterOf(data));
}

Status WriteFileAtomic(FileSystem* fs, const std::string& path, const FileWriter& write) {
  const std::string tmp = TempPathFor(path);
  RETURN_IF_ERROR(WriteFileSynced(fs, tmp, write));
  if (Status st = fs->Rename(tmp, path); !st.ok()) {
    (void)fs->RemoveFile(tmp);
    return st;
  }
  // Without this the rename (and the temporary file's very name) may be undone by a crash,
  // bringing the old content back after we reported the new one written.
  return fs->SyncDir(Dirname(path)).WithContext("writing " + path);
}

Status WriteFileAtomic(FileSystem* fs, const std::string& path, std::string_view data) {
  return WriteFileAtomic(fs, path, WriterOf(data));
}

Status RenameAtomic(FileSystem* fs, const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(fs->Rename(from, to));
  const std::string to_dir = Dirname(to);
  RETURN_IF_ERROR(fs->SyncDir(to_dir));
  const std::string from_dir = Dirname(from);
  if (from_dir != to_dir) RETURN_IF_ERROR(fs->SyncDir(from_dir));
  return OkStatus();
}

}  // namespace drover
