// The trainer's bootstrap store (engine/parallel/kv_store.h) over the coordinator's
// rendezvous service: the keys of one (job, attempt), so that a dead attempt's ranks never
// meet a new attempt's. Under `drover train --nproc` the launcher serves the same service.
//
// Thread-safety: as RendezvousClient, any thread.
#pragma once

#include <chrono>
#include <string>

#include "worker/engine/parallel/kv_store.h"
#include "worker/rendezvous_client.h"

namespace drover {

class RendezvousKvStore final : public engine::parallel::KvStore {
 public:
  // `client` is not owned and must outlive the store.
  explicit RendezvousKvStore(RendezvousClient* client) : client_(client) {}

  Status Set(const std::string& key, const std::string& value) override {
    return client_->Set(key, value);
  }
  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    return client_->WaitGet(key, timeout.count());
  }

 private:
  RendezvousClient* client_;
};

}  // namespace drover
