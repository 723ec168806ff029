// The file system behind one small interface (after leveldb's Env), so that tests can put a
// fault-injecting fake (tests/unit/common/fault_injection_fs.h) under the code that must
// survive full disks, I/O errors and crashes, and one implementation of the durable-write
// protocol that every writer shares.
//
// Durability model the helpers below rely on (POSIX, as ext4/xfs implement it): a file's
// data survives a crash only once the file was fsynced (WritableFile::Sync); a new name in a
// directory (a created file, a mkdir, a rename) survives only once that directory was
// fsynced (SyncDir). Everything else may be lost, and a rename may be undone.
//
// Errors are Statuses naming the path (errno through ErrnoToStatus: ENOENT -> NotFound,
// ENOSPC -> ResourceExhausted, EIO -> Internal, ...). Implementations are thread-safe;
// a WritableFile is not (one writer per file).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace drover {

// A file open for writing. Appends go straight to the file (no user-space buffer), so a
// failed Append is reported by that call. Destroying it without Close closes it and drops
// the error: call Close when the outcome matters.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  // fsync(2): the data appended so far is durable (the file's name is not: see SyncDir).
  virtual Status Sync() = 0;
  // Reports close(2)'s error, which some file systems (NFS) use for failed writes.
  virtual Status Close() = 0;
  virtual const std::string& path() const = 0;
};

// What Stat reports.
struct FileInfo {
  uint64_t size = 0;
  bool is_directory = false;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The real (POSIX) file system. Never deleted; safe from any thread.
  static FileSystem* Default();

  // Creates `path`, or truncates it when it exists, for writing (mode 0644).
  virtual StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // The whole file. NotFound when absent; InvalidArgument for a directory.
  virtual StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // NotFound when absent. Symbolic links are followed.
  virtual StatusOr<FileInfo> Stat(const std::string& path) = 0;
  // The names in `dir` (not "." or ".."), sorted bytewise. NotFound when `dir` is absent.
  virtual StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;

  // rename(2), without any fsync (RenameAtomic below adds them). Replacing a non-empty
  // directory is FailedPrecondition.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // fsync(2) on a directory: the creations, renames and removals in it become durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  // unlink(2) of a file. NotFound when absent.
  virtual Status RemoveFile(const std::string& path) = 0;
  // rm -rf, never following symbolic links. OK when `path` is absent.
  virtual Status RemoveAll(const std::string& path) = 0;
  // mkdir -p (mode 0755). OK when the directory exists; FailedPrecondition when `path` or a
  // parent exists and is not a directory. The new directories are not yet durable.
  virtual Status MakeDirs(const std::string& path) = 0;
};

// Writes a file's content through `file`: called once by the helpers below, which own the
// file's Sync and Close. Returning an error abandons the write.
using FileWriter = std::function<Status(WritableFile& file)>;

// Creates `path`, lets `write` fill it, fsyncs and closes it: the content is durable, the
// name is not until the caller fsyncs the directory (a checkpoint's shards are published by
// renaming their whole directory). On any failure `path` is removed, so a full disk is not
// left holding a partial file, and the first error is returned.
Status WriteFileSynced(FileSystem* fs, const std::string& path, const FileWriter& write);
Status WriteFileSynced(FileSystem* fs, const std::string& path, std::string_view data);

// Replaces `path` so that a crash at any moment leaves either the old or the new content,
// never a mix: WriteFileSynced to a temporary file in the same directory (a name private to
// this call), rename it over `path`, fsync the directory. The directory must exist. On
// failure before the rename the temporary file is removed and `path` is untouched; when
// only the final directory fsync fails, `path` already holds the new content (which a
// crash may still undo) and the error is returned.
Status WriteFileAtomic(FileSystem* fs, const std::string& path, const FileWriter& write);
Status WriteFileAtomic(FileSystem* fs, const std::string& path, std::string_view data);

// Rename(from, to), then SyncDir on the directory of `to` (and of `from` when it differs)
// so the rename survives a crash. Works for directories (step_N.tmp -> step_N).
Status RenameAtomic(FileSystem* fs, const std::string& from, const std::string& to);

}  // namespace drover
