// File-system helpers with durable-write semantics, for state files, checkpoints and specs.
// The durable writes (WriteFileAtomic, RenameAtomic, FsyncDir) are the real file system's
// case of common/file_system.h, which holds their one implementation; code that tests
// should be able to fail under (checkpoints, model files, token shards) takes a FileSystem.
//
// Every error is a Status naming the path (errno translated by ErrnoToStatus: ENOENT ->
// NotFound, EACCES -> FailedPrecondition, ENOSPC -> ResourceExhausted, ...). All functions
// are safe to call from any thread; they share no state. Concurrent writers of the same path
// are the caller's business (WriteFileAtomic keeps each temporary file private, so the
// last rename wins and readers never see a torn file).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace drover {

// The whole file. NotFound when it does not exist.
StatusOr<std::string> ReadFileToString(const std::string& path);

// Reads the file from its start in pieces of `chunk` bytes (the last may be shorter),
// calling fn on each in order, and returns how many bytes it read: a file too large to hold
// at once can be checksummed and scattered as it is read. An error from fn stops the read
// and is returned. NotFound when the file does not exist.
StatusOr<size_t> ReadFileInChunks(const std::string& path, size_t chunk,
                                  const std::function<Status(const char* data, size_t n)>& fn);

// Bytes [offset, offset + length) of a file.
struct FileSpan {
  uint64_t offset = 0, length = 0;
};

// Reads each of `spans` in turn, in pieces of `chunk` bytes from its offset (a span's last
// piece may be shorter), calling fn(offset in the file, data, n) on each in order, and
// returns how many bytes it read: a reader that needs some blocks of a large file reads
// those alone. OutOfRange when the file ends inside a span (the pieces before that were
// handed over); an error from fn stops the read and is returned.
StatusOr<size_t> ReadFileSpansInChunks(
    const std::string& path, const std::vector<FileSpan>& spans, size_t chunk,
    const std::function<Status(uint64_t offset, const char* data, size_t n)>& fn);

// The last `max_bytes` of the file (all of it when shorter): a log's tail without reading
// the log. NotFound when it does not exist.
StatusOr<std::string> ReadFileTail(const std::string& path, size_t max_bytes);

// Replaces `path` with `data` so that a crash at any moment leaves either the old or the new
// content, never a mix: writes a temporary file in the same directory, fsyncs it, renames it
// over `path`, then fsyncs the directory so the rename itself is durable. The directory must
// exist. On failure the temporary file is removed and `path` is untouched.
// WriteFileAtomic(FileSystem::Default(), path, data).
Status WriteFileAtomic(const std::string& path, std::string_view data);

// fsync(2) on a directory: makes creations, renames and deletions inside it durable.
Status FsyncDir(const std::string& dir);

// fsync(2) on a regular file already written by other means (e.g. a checkpoint shard).
Status FsyncFile(const std::string& path);

// mkdir -p with mode 0755. OK when the directory already exists; FailedPrecondition when
// `path` or one of its parents exists but is not a directory.
Status MakeDirs(const std::string& path);

// rm -rf: removes a file, or a directory and everything below it. OK when `path` does not
// exist. Symbolic links are removed, never followed.
Status RemoveAll(const std::string& path);

// Creates a new directory $TMPDIR/<prefix>XXXXXX (/tmp when TMPDIR is unset or empty),
// mode 0700, with a name no other process got, and returns its path. The caller removes it
// (RemoveAll).
StatusOr<std::string> MakeTempDir(const std::string& prefix);

// The paths matching a glob(3) pattern ("data/train_*.bin"), sorted. No match is an empty
// list, not an error.
StatusOr<std::vector<std::string>> ListGlob(const std::string& pattern);

// True when `path` exists (a dangling symbolic link counts as absent).
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);

// rename(2) `from` to `to` (files, or directories such as step_N.tmp -> step_N), then fsyncs
// the parent directory of `to` (and of `from` when it differs) so the rename survives a
// crash. Replacing a non-empty directory fails (FailedPrecondition or AlreadyExists).
// RenameAtomic(FileSystem::Default(), from, to).
Status RenameAtomic(const std::string& from, const std::string& to);

// "a/b/c" -> "a/b"; "c" -> "."; "/c" -> "/".
std::string Dirname(const std::string& path);

}  // namespace drover
