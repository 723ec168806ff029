// KvStore: the bootstrap key-value store a group of ranks uses to find each other before any
// communicator exists (Gloo's pair addresses, NCCL's unique id).
//
// The trainer passes an adapter over the coordinator's rendezvous service (DESIGN.md
// "Rendezvous"); tests and single-process runs use InMemoryKvStore. Keys are written once
// per attempt and never deleted: a group name must not be reused within one store.
//
// Thread-safety: every implementation may be called from any thread at once.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "common/mutex.h"
#include "common/status.h"

namespace drover::engine::parallel {

// The interface is header-only, so that an implementation outside the engine library (the
// trainer's adapter over the rendezvous client, in worker/) needs nothing from it.
class KvStore {
 public:
  virtual ~KvStore() = default;

  // Sets (or overwrites) `key`.
  virtual Status Set(const std::string& key, const std::string& value) = 0;

  // Blocks until `key` exists, up to `timeout`; DeadlineExceeded naming the key.
  virtual StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

// A store in this process's memory, for ranks run as threads of one process.
class InMemoryKvStore final : public KvStore {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  Mutex mu_;
  CondVar changed_;  // notified on every Set
  std::map<std::string, std::string> kv_ GUARDED_BY(mu_);
};

// Every key of `base` under "<prefix>/", so that many groups (or attempts) share one store.
// `base` must outlive this store.
class PrefixKvStore final : public KvStore {
 public:
  PrefixKvStore(KvStore* base, std::string prefix);

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }

  KvStore* const base_;
  const std::string prefix_;
};

}  // namespace drover::engine::parallel
