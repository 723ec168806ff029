// A Store that passes everything to another one, and fails the writes a test asks it to:
// a full disk on demand, the way leveldb's FaultInjectionTestEnv fails file operations. A
// failed write writes nothing, as a real failed transaction.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "common/mutex.h"
#include "coordinator/store/store.h"

namespace drover::coordinator::testing {

class FaultInjectionStore final : public Store {
 public:
  explicit FaultInjectionStore(std::unique_ptr<Store> base) : base_(std::move(base)) {}

  // Every later write for which `fail(batch)` returns an error fails with that error.
  void FailWrites(std::function<Status(const StoreBatch&)> fail) {
    MutexLock lock(&mu_);
    fail_ = std::move(fail);
  }
  // Every later write fails with `error`.
  void FailAllWrites(Status error) {
    FailWrites([error](const StoreBatch&) { return error; });
  }
  // Writes succeed again (the disk has room).
  void HealWrites() { FailWrites(nullptr); }
  // Writes wait until Resume(): lets a test queue several batches that the writer then
  // takes together.
  void Pause() {
    MutexLock lock(&mu_);
    paused_ = true;
  }
  void Resume() {
    {
      MutexLock lock(&mu_);
      paused_ = false;
    }
    cv_.SignalAll();
  }
  int failed_writes() const {
    MutexLock lock(&mu_);
    return failed_writes_;
  }

  Status Apply(const StoreBatch& batch) override {
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return !paused_; });
      if (fail_) {
        if (Status st = fail_(batch); !st.ok()) {
          ++failed_writes_;
          return st;
        }
      }
    }
    return base_->Apply(batch);
  }
  StatusOr<StoreContents> LoadAll() override { return base_->LoadAll(); }

 private:
  const std::unique_ptr<Store> base_;
  mutable Mutex mu_;
  CondVar cv_;
  std::function<Status(const StoreBatch&)> fail_ GUARDED_BY(mu_);
  bool paused_ GUARDED_BY(mu_) = false;
  int failed_writes_ GUARDED_BY(mu_) = 0;
};

// The error SQLite gives for a full disk, as SqliteToStatus translates it.
inline Status DiskFull() { return ResourceExhaustedError("sqlite: database or disk is full"); }

}  // namespace drover::coordinator::testing
