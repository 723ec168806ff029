#include "worker/engine/publish_fence.h"

#include <thread>

namespace drover::engine {

namespace {

Status ConfirmRetrying(PublishFence* fence, std::chrono::milliseconds timeout,
                       const std::atomic<bool>* stop, std::atomic<bool>* unreachable) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    Status st = fence->Confirm();
    if (st.ok() || st.code() == StatusCode::kFailedPrecondition) return st;
    if (stop != nullptr && stop->load()) {
      return CancelledError("stopped while confirming that this attempt is current");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return st.WithContext("cannot confirm with the coordinator that this attempt is current");
    }
    if (unreachable != nullptr) unreachable->store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

Status ConfirmWithin(PublishFence* fence, std::chrono::milliseconds timeout,
                     const std::atomic<bool>* stop, std::atomic<bool>* unreachable) {
  if (fence == nullptr) return OkStatus();
  Status st = ConfirmRetrying(fence, timeout, stop, unreachable);
  if (unreachable != nullptr) unreachable->store(false);
  return st;
}

}  // namespace drover::engine
