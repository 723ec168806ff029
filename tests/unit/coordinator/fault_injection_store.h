// A Store that passes everything to another one, and fails the writes a test asks it to:
// a full disk on demand, the way leveldb's FaultInjectionTestEnv fails file operations. A
// failed write writes nothing, as a real failed transaction.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "coordinator/store/store.h"

namespace drover::coordinator::testing {

class FaultInjectionStore final : public Store {
 public:
  explicit FaultInjectionStore(std::unique_ptr<Store> base) : base_(std::move(base)) {}

  // Every later write for which `fail(batch)` returns an error fails with that error.
  void FailWrites(std::function<Status(const StoreBatch&)> fail) {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = true;
  }
  void Resume() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      paused_ = false;
    }
    cv_.notify_all();
  }
  int failed_writes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_writes_;
  }

  Status Apply(const StoreBatch& batch) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !paused_; });
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
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<Status(const StoreBatch&)> fail_;  // GUARDED_BY(mu_)
  bool paused_ = false;                            // GUARDED_BY(mu_)
  int failed_writes_ = 0;                          // GUARDED_BY(mu_)
};

// The error SQLite gives for a full disk, as SqliteToStatus translates it.
inline Status DiskFull() { return ResourceExhaustedError("sqlite: database or disk is full"); }

}  // namespace drover::coordinator::testing
