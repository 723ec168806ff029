// A call into the NVIDIA driver or NVML that may never return (a wedged driver holds its
// callers for minutes, or until the node is reset), made so that its caller can give up on
// it and say so: CallWithin runs `fn` on a thread of its own and waits at most `timeout_ms`.
// A call given up on cannot be cancelled; its thread is left to finish, or to die with the
// process, holding what it uses (its result is dropped then).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace drover {

// fn's result, or nullopt when it has not returned within `timeout_ms` (real time).
template <typename T>
std::optional<T> CallWithin(std::function<T()> fn, int timeout_ms) {
  struct Shared {
    Mutex mu;
    CondVar cv;
    std::optional<T> result GUARDED_BY(mu);
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, fn = std::move(fn)]() {
    T value = fn();
    MutexLock lock(&shared->mu);
    shared->result.emplace(std::move(value));
    shared->cv.SignalAll();
  }).detach();
  MutexLock lock(&shared->mu);
  shared->cv.WaitFor(&shared->mu, std::chrono::milliseconds(timeout_ms),
                     [&]() REQUIRES(shared->mu) { return shared->result.has_value(); });
  if (!shared->result) return std::nullopt;
  return std::move(shared->result);
}

}  // namespace drover
