// AttemptLease: the trainer's PublishFence under a coordinator (worker/engine/publish_fence.h).
//
// A thread confirms the attempt every validity / 4 with a call to the attempt's rendezvous
// namespace, which the coordinator serves only for the job's current attempt. The lease is
// current while the last confirmation is younger than `validity_ms`; the agent sets that to
// two thirds of the coordinator's node timeout, so a trainer cut off from the coordinator
// stops publishing before the coordinator can declare its node dead and start another
// attempt. While the coordinator is merely away (a restart), training goes on and what is to
// be published waits; so it does at a new attempt's start, whose confirmations the
// coordinator refuses until the earlier attempt's leases have lapsed (coordinator/
// rendezvous.h). When the coordinator answers that the attempt is superseded, or that it
// serves no leases (a coordinator of an earlier release), `on_superseded` is called once
// (the trainer stops).
//
// Thread-safety: Current and Confirm may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "common/mutex.h"
#include "worker/engine/publish_fence.h"
#include "worker/rendezvous_client.h"

namespace drover {

class AttemptLease final : public engine::PublishFence {
 public:
  // `client` (not owned, must outlive this) should have a short RPC timeout (validity / 2),
  // so that a partition does not hold a confirmation for long.
  AttemptLease(RendezvousClient* client, int64_t validity_ms,
               std::function<void(const Status&)> on_superseded);
  ~AttemptLease() override;
  AttemptLease(const AttemptLease&) = delete;
  AttemptLease& operator=(const AttemptLease&) = delete;

  bool Current() const override;
  Status Confirm() override;

 private:
  void Loop();

  RendezvousClient* const client_;
  const int64_t validity_ms_;
  const std::function<void(const Status&)> on_superseded_;
  std::atomic<int64_t> confirmed_ms_{-1};  // steady-clock ms of the last confirmation
  std::atomic<bool> superseded_{false};
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace drover
