#include "tests/unit/common/fault_injection_fs.h"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "common/files.h"

namespace drover::testing {
namespace {

const char* OpName(FaultInjectionFileSystem::Op op) {
  using Op = FaultInjectionFileSystem::Op;
  switch (op) {
    case Op::kAny:
      return "any";
    case Op::kCreate:
      return "create";
    case Op::kAppend:
      return "write";
    case Op::kSync:
      return "fsync";
    case Op::kClose:
      return "close";
    case Op::kRename:
      return "rename";
    case Op::kSyncDir:
      return "fsync dir";
    case Op::kRemove:
      return "remove";
    case Op::kMakeDirs:
      return "mkdir";
  }
  return "?";
}

std::string Normalize(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// `path` is `dir` or below it.
bool IsUnder(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

// `path` with its prefix `from` (IsUnder) replaced by `to`.
std::string Moved(const std::string& path, const std::string& from, const std::string& to) {
  return IsUnder(path, from) ? to + path.substr(from.size()) : path;
}

}  // namespace

// Passes to the real file, under the file system's faults and bookkeeping.
class FaultInjectionFileSystem::File final : public WritableFile {
 public:
  File(FaultInjectionFileSystem* fs, std::unique_ptr<WritableFile> base)
      : fs_(fs), base_(std::move(base)) {}

  Status Append(std::string_view data) override {
    MutexLock lock(&fs_->mu_);
    bool short_write = false;
    if (auto fault = fs_->OnOpLocked(Op::kAppend, path(), &short_write)) {
      if (short_write && base_->Append(data.substr(0, data.size() / 2)).ok()) {
        Grow(data.size() / 2);
      }
      return *fault;
    }
    RETURN_IF_ERROR(base_->Append(data));
    Grow(data.size());
    return OkStatus();
  }

  Status Sync() override {
    MutexLock lock(&fs_->mu_);
    if (auto fault = fs_->OnOpLocked(Op::kSync, path(), nullptr)) return *fault;
    RETURN_IF_ERROR(base_->Sync());
    if (auto it = fs_->files_.find(path()); it != fs_->files_.end()) {
      it->second.synced = it->second.size;
    }
    return OkStatus();
  }

  Status Close() override {
    MutexLock lock(&fs_->mu_);
    if (auto fault = fs_->OnOpLocked(Op::kClose, path(), nullptr)) {
      (void)base_->Close();  // a failed close(2) still releases the descriptor
      return *fault;
    }
    return base_->Close();
  }

  const std::string& path() const override { return base_->path(); }

 private:
  void Grow(uint64_t n) REQUIRES(fs_->mu_) {
    if (auto it = fs_->files_.find(path()); it != fs_->files_.end()) it->second.size += n;
  }

  FaultInjectionFileSystem* const fs_;
  const std::unique_ptr<WritableFile> base_;
};

void FaultInjectionFileSystem::AddFault(Fault f) {
  MutexLock lock(&mu_);
  faults_.push_back(f);
}

void FaultInjectionFileSystem::FailNth(Op op, int nth, int error) {
  AddFault({op, nth, /*every=*/false, Action::kFail, error});
}

void FaultInjectionFileSystem::FailFrom(Op op, int nth, int error) {
  AddFault({op, nth, /*every=*/true, Action::kFail, error});
}

void FaultInjectionFileSystem::ShortWriteNth(int nth, int error) {
  AddFault({Op::kAppend, nth, /*every=*/false, Action::kShortWrite, error});
}

void FaultInjectionFileSystem::CrashBeforeNth(Op op, int nth) {
  AddFault({op, nth, /*every=*/false, Action::kCrash, EIO});
}

void FaultInjectionFileSystem::ClearFaults() {
  MutexLock lock(&mu_);
  faults_.clear();
  crashed_ = false;
}

int FaultInjectionFileSystem::Count(Op op) const {
  MutexLock lock(&mu_);
  auto it = counts_.find(op);
  return it == counts_.end() ? 0 : it->second;
}

void FaultInjectionFileSystem::ResetCounts() {
  MutexLock lock(&mu_);
  counts_.clear();
}

bool FaultInjectionFileSystem::crashed() const {
  MutexLock lock(&mu_);
  return crashed_;
}

std::optional<Status> FaultInjectionFileSystem::OnOpLocked(Op op, const std::string& path,
                                                           bool* short_write) {
  ++counts_[op];
  ++counts_[Op::kAny];
  if (crashed_) return ErrnoToStatus(EIO, std::string(OpName(op)) + " " + path + " (crashed)");
  std::optional<Fault> fired;
  for (Fault& f : faults_) {
    if (f.op != op && f.op != Op::kAny) continue;
    ++f.seen;
    if (!fired && (f.seen == f.nth || (f.every && f.seen > f.nth))) fired = f;
  }
  std::erase_if(faults_, [](const Fault& f) { return !f.every && f.seen >= f.nth; });
  if (!fired) return std::nullopt;
  if (fired->action == Action::kCrash) {
    DropUnsyncedDataLocked();
    crashed_ = true;
    return ErrnoToStatus(EIO, std::string(OpName(op)) + " " + path + " (crashed)");
  }
  if (short_write != nullptr) *short_write = fired->action == Action::kShortWrite;
  return ErrnoToStatus(fired->error, std::string(OpName(op)) + " " + path + " (injected)");
}

StatusOr<std::unique_ptr<WritableFile>> FaultInjectionFileSystem::NewWritableFile(
    const std::string& raw_path) {
  const std::string path = Normalize(raw_path);
  MutexLock lock(&mu_);
  if (auto fault = OnOpLocked(Op::kCreate, path, nullptr)) return *fault;
  const bool existed = base_->Stat(path).ok();
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(path));
  // An existing file was truncated: until synced, a crash leaves it empty (the worst case).
  files_[path] = FileState{};
  if (!existed)
    changes_.push_back({Change::kCreated, path, "", std::nullopt, false, {Dirname(path)}});
  return std::unique_ptr<WritableFile>(std::make_unique<File>(this, std::move(file)));
}

StatusOr<std::string> FaultInjectionFileSystem::ReadFile(const std::string& path) {
  return base_->ReadFile(path);
}

StatusOr<FileInfo> FaultInjectionFileSystem::Stat(const std::string& path) {
  return base_->Stat(path);
}

StatusOr<std::vector<std::string>> FaultInjectionFileSystem::ListDir(const std::string& dir) {
  return base_->ListDir(dir);
}

Status FaultInjectionFileSystem::Rename(const std::string& raw_from, const std::string& raw_to) {
  const std::string from = Normalize(raw_from), to = Normalize(raw_to);
  MutexLock lock(&mu_);
  if (auto fault = OnOpLocked(Op::kRename, from + " to " + to, nullptr)) return *fault;
  Change c{Change::kRenamed, to, from, std::nullopt, false, {Dirname(to)}};
  if (Dirname(from) != Dirname(to)) c.unsynced_dirs.push_back(Dirname(from));
  if (auto target = base_->Stat(to); target.ok()) {
    if (target->is_directory) {
      c.replaced_dir = true;
    } else {
      ASSIGN_OR_RETURN(c.replaced, base_->ReadFile(to));
      // What a crash restores of it is what of it was durable.
      if (auto it = files_.find(to); it != files_.end() && it->second.synced < c.replaced->size()) {
        c.replaced->resize(it->second.synced);
      }
    }
  }
  RETURN_IF_ERROR(base_->Rename(from, to));
  // The replaced file is gone; its pending changes stay, for an undo reaches them only
  // after undoing this rename, when the name is the old file's again.
  std::erase_if(files_, [&](const auto& f) { return IsUnder(f.first, to); });
  RenameTrackedLocked(from, to);
  changes_.push_back(std::move(c));
  return OkStatus();
}

Status FaultInjectionFileSystem::SyncDir(const std::string& raw_dir) {
  const std::string dir = Normalize(raw_dir);
  MutexLock lock(&mu_);
  if (auto fault = OnOpLocked(Op::kSyncDir, dir, nullptr)) return *fault;
  RETURN_IF_ERROR(base_->SyncDir(dir));
  for (Change& c : changes_) std::erase(c.unsynced_dirs, dir);
  std::erase_if(changes_, [](const Change& c) { return c.unsynced_dirs.empty(); });
  return OkStatus();
}

Status FaultInjectionFileSystem::RemoveFile(const std::string& raw_path) {
  const std::string path = Normalize(raw_path);
  MutexLock lock(&mu_);
  if (auto fault = OnOpLocked(Op::kRemove, path, nullptr)) return *fault;
  RETURN_IF_ERROR(base_->RemoveFile(path));
  ForgetLocked(path);
  return OkStatus();
}

Status FaultInjectionFileSystem::RemoveAll(const std::string& raw_path) {
  const std::string path = Normalize(raw_path);
  MutexLock lock(&mu_);
  if (auto fault = OnOpLocked(Op::kRemove, path, nullptr)) return *fault;
  RETURN_IF_ERROR(base_->RemoveAll(path));
  ForgetLocked(path);
  return OkStatus();
}

Status FaultInjectionFileSystem::MakeDirs(const std::string& raw_path) {
  const std::string path = Normalize(raw_path);
  MutexLock lock(&mu_);
  if (auto fault = OnOpLocked(Op::kMakeDirs, path, nullptr)) return *fault;
  std::vector<std::string> made;  // deepest first
  for (std::string d = path; !base_->Stat(d).ok(); d = Dirname(d)) {
    made.push_back(d);
    if (Dirname(d) == d) break;
  }
  RETURN_IF_ERROR(base_->MakeDirs(path));
  for (auto it = made.rbegin(); it != made.rend(); ++it) {
    changes_.push_back({Change::kMadeDir, *it, "", std::nullopt, false, {Dirname(*it)}});
  }
  return OkStatus();
}

void FaultInjectionFileSystem::DropUnsyncedData() {
  MutexLock lock(&mu_);
  DropUnsyncedDataLocked();
}

void FaultInjectionFileSystem::DropUnsyncedDataLocked() {
  for (const auto& [path, state] : files_) {
    if (state.synced >= state.size) continue;
    auto data = base_->ReadFile(path);
    if (data.ok()) (void)RewriteLocked(path, data->substr(0, state.synced));
  }
  files_.clear();
  while (!changes_.empty()) {
    Change c = std::move(changes_.back());
    changes_.pop_back();
    UndoLocked(c);
  }
}

// Best effort: an entry the code removed since is already gone.
void FaultInjectionFileSystem::UndoLocked(const Change& c) {
  switch (c.kind) {
    case Change::kCreated:
      (void)base_->RemoveFile(c.path);
      break;
    case Change::kMadeDir:
      (void)base_->RemoveAll(c.path);
      break;
    case Change::kRenamed:
      if (!base_->Rename(c.path, c.from).ok()) break;
      RenameTrackedLocked(c.path, c.from);
      if (c.replaced.has_value()) (void)RewriteLocked(c.path, *c.replaced);
      if (c.replaced_dir) (void)base_->MakeDirs(c.path);
      break;
  }
}

void FaultInjectionFileSystem::RenameTrackedLocked(const std::string& from, const std::string& to) {
  std::map<std::string, FileState> files;
  for (auto& [path, state] : files_) files[Moved(path, from, to)] = state;
  files_ = std::move(files);
  for (Change& c : changes_) {
    c.path = Moved(c.path, from, to);
    c.from = Moved(c.from, from, to);
    for (std::string& d : c.unsynced_dirs) d = Moved(d, from, to);
  }
}

// Removed entries are gone for good (removals count as durable), with whatever was pending
// under them.
void FaultInjectionFileSystem::ForgetLocked(const std::string& path) {
  std::erase_if(files_, [&](const auto& f) { return IsUnder(f.first, path); });
  std::erase_if(changes_, [&](const Change& c) { return IsUnder(c.path, path); });
}

Status FaultInjectionFileSystem::RewriteLocked(const std::string& path, const std::string& data) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(path));
  RETURN_IF_ERROR(file->Append(data));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace drover::testing
