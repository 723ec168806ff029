// A FileSystem that passes everything to a real one and, on demand, fails an operation
// (ENOSPC, EIO, ...), makes a write short, or "loses power": after leveldb's
// FaultInjectionTestEnv, it remembers what is not yet durable and can undo exactly that.
//
// Durability model (file_system.h's): a file's bytes past its last Sync are lost; a created
// file, a made directory and a rename are lost until the directory holding the new name is
// synced (a rename also waits for the source's directory). Losing a rename moves the entry
// back and restores the file it replaced. Removals are taken as durable at once (a crash
// never brings back what the code removed), and only what went through this object is
// tracked: files a test made by other means count as durable.
//
// Everything is on the real disk, so after DropUnsyncedData a test reads the survivors with
// the ordinary functions (LoadLatestCheckpoint, ReadFileToString, ...).
//
// Thread-safe (one mutex around every call, the real I/O included); files it returns must
// not outlive it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/file_system.h"
#include "common/mutex.h"

namespace drover::testing {

class FaultInjectionFileSystem final : public FileSystem {
 public:
  // The operations that change the disk, which is what faults and counts apply to (reads
  // pass through). kAny counts every one of them.
  enum class Op { kAny, kCreate, kAppend, kSync, kClose, kRename, kSyncDir, kRemove, kMakeDirs };

  explicit FaultInjectionFileSystem(FileSystem* base) : base_(base) {}  // not owned

  // Faults. `nth` counts calls of `op` from the moment the fault is set, 1 being the next.
  // That call fails with `error` (an errno value) having done nothing.
  void FailNth(Op op, int nth, int error);
  // The same, for that call and every later one (a disk that stays full).
  void FailFrom(Op op, int nth, int error);
  // The nth Append writes the first half of its data, then fails with `error`.
  void ShortWriteNth(int nth, int error);
  // Power is lost just before the nth call of `op`: DropUnsyncedData(), then that call and
  // every later one fail with EIO, as the process is gone.
  void CrashBeforeNth(Op op, int nth);
  // No more faults, and a crashed file system works again (the machine rebooted).
  void ClearFaults();

  // Calls of `op` since construction or ResetCounts, faulty ones included: a test counts a
  // clean run, then fails or crashes at each of its steps in turn.
  int Count(Op op) const;
  void ResetCounts();
  bool crashed() const;

  // What a power loss does now: truncates every file written here to its last Sync, undoes
  // (newest first) every creation, mkdir and rename whose directory was not synced since,
  // and forgets it all (what is left is durable).
  void DropUnsyncedData();

  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  StatusOr<std::string> ReadFile(const std::string& path) override;
  StatusOr<FileInfo> Stat(const std::string& path) override;
  StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveAll(const std::string& path) override;
  Status MakeDirs(const std::string& path) override;

 private:
  class File;
  enum class Action { kFail, kShortWrite, kCrash };
  struct Fault {
    Op op;
    int nth;
    bool every;
    Action action;
    int error;
    int seen = 0;
  };
  struct FileState {
    uint64_t size = 0;
    uint64_t synced = 0;
  };
  // A directory entry that is not durable yet. Paths are kept current: a later rename of
  // a directory above them renames them too (and undoing it renames them back).
  struct Change {
    enum Kind { kCreated, kMadeDir, kRenamed } kind;
    std::string path;                        // what was created or made, or the rename's target
    std::string from;                        // kRenamed: the source
    std::optional<std::string> replaced;     // kRenamed over a file: its content
    bool replaced_dir = false;               // kRenamed over an (empty) directory
    std::vector<std::string> unsynced_dirs;  // whose fsync it still waits for
  };

  void AddFault(Fault f);
  // Counts a call of `op` on `path`; returns the error it must fail with (a fault it met, or
  // the crash), if any. *short_write (Appends) says whether half the data goes through.
  std::optional<Status> OnOpLocked(Op op, const std::string& path, bool* short_write) REQUIRES(mu_);
  void DropUnsyncedDataLocked() REQUIRES(mu_);
  void UndoLocked(const Change& c) REQUIRES(mu_);
  void RenameTrackedLocked(const std::string& from, const std::string& to) REQUIRES(mu_);
  void ForgetLocked(const std::string& path) REQUIRES(mu_);
  Status RewriteLocked(const std::string& path, const std::string& data) REQUIRES(mu_);

  FileSystem* const base_;
  mutable Mutex mu_;
  std::vector<Fault> faults_ GUARDED_BY(mu_);
  std::map<Op, int> counts_ GUARDED_BY(mu_);
  bool crashed_ GUARDED_BY(mu_) = false;
  std::map<std::string, FileState> files_ GUARDED_BY(mu_);  // written here, by current name
  std::vector<Change> changes_ GUARDED_BY(mu_);             // oldest first
};

}  // namespace drover::testing
