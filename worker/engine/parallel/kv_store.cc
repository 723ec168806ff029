#include "worker/engine/parallel/kv_store.h"

#include <utility>

namespace drover::engine::parallel {

Status InMemoryKvStore::Set(const std::string& key, const std::string& value) {
  {
    MutexLock lock(&mu_);
    kv_[key] = value;
  }
  changed_.SignalAll();
  return OkStatus();
}

StatusOr<std::string> InMemoryKvStore::Get(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  MutexLock lock(&mu_);
  const bool found =
      changed_.WaitFor(&mu_, timeout, [&]() REQUIRES(mu_) { return kv_.count(key) > 0; });
  if (!found) {
    return DeadlineExceededError("key \"" + key + "\" was not set within " +
                                 std::to_string(timeout.count()) + " ms");
  }
  return kv_.at(key);
}

PrefixKvStore::PrefixKvStore(KvStore* base, std::string prefix)
    : base_(base), prefix_(std::move(prefix)) {}

Status PrefixKvStore::Set(const std::string& key, const std::string& value) {
  return base_->Set(Key(key), value);
}

StatusOr<std::string> PrefixKvStore::Get(const std::string& key,
                                         std::chrono::milliseconds timeout) {
  return base_->Get(Key(key), timeout);
}

}  // namespace drover::engine::parallel
