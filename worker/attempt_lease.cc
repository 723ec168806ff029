#include "worker/attempt_lease.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <string>

#include "common/protocol_version.h"

namespace drover {
namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

AttemptLease::AttemptLease(RendezvousClient* client, int64_t validity_ms,
                           std::function<void(const Status&)> on_superseded)
    : client_(client),
      validity_ms_(validity_ms),
      on_superseded_(std::move(on_superseded)),
      thread_([this] { Loop(); }) {}

AttemptLease::~AttemptLease() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

bool AttemptLease::Current() const {
  const int64_t at = confirmed_ms_.load();
  return !superseded_.load() && at >= 0 && SteadyMs() - at < validity_ms_;
}

Status AttemptLease::Confirm() {
  if (superseded_.load()) return FailedPreconditionError("this attempt is superseded");
  // Measured from before the call: the coordinator answered at some moment after this.
  const int64_t sent = SteadyMs();
  Status st = client_->ConfirmLease();
  if (st.ok()) {
    int64_t prev = confirmed_ms_.load();
    while (prev < sent && !confirmed_ms_.compare_exchange_weak(prev, sent)) {
    }
    return st;
  }
  // Either answer is final: the attempt is superseded, or the coordinator (of an earlier
  // release than this trainer) serves no leases, so that nothing could ever be published.
  const bool superseded = st.code() == StatusCode::kFailedPrecondition;
  const bool unserved = st.code() == StatusCode::kUnimplemented;
  if ((superseded || unserved) && !superseded_.exchange(true)) {
    if (superseded) {
      spdlog::error("the coordinator says this attempt is superseded ({}); stopping", st.message());
    } else {
      spdlog::error(
          "the coordinator does not serve trainer leases ({}): it is of an earlier release than "
          "this trainer (drover protocol {}); stopping",
          st.message(), kProtocolVersion);
    }
    if (on_superseded_) on_superseded_(st);
  }
  return st;
}

void AttemptLease::Loop() {
  const auto period = std::chrono::milliseconds(std::max<int64_t>(validity_ms_ / 4, 1));
  MutexLock lock(&mu_);
  while (!stop_) {
    lock.Unlock();
    Status st = Confirm();
    lock.Lock();
    if (superseded_.load()) return;
    cv_.WaitFor(&mu_, period, [this]() REQUIRES(mu_) { return stop_; });
  }
}

}  // namespace drover
