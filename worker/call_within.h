// A call into the NVIDIA driver or NVML that may never return (a wedged driver holds its
// callers for minutes, or until the node is reset), made so that its caller can give up on
// it and say so: CallWithin runs `fn` on a thread of its own and waits at most `timeout_ms`.
// A call given up on cannot be cancelled; its thread is left to finish, or to die with the
// process, holding what it uses (its result is dropped then).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace drover {

// fn's result, or nullopt when it has not returned within `timeout_ms` (real time).
template <typename T>
std::optional<T> CallWithin(std::function<T()> fn, int timeout_ms) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<T> result;  // guarded by mu
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, fn = std::move(fn)]() {
    T value = fn();
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->result.emplace(std::move(value));
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mu);
  shared->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                      [&] { return shared->result.has_value(); });
  if (!shared->result) return std::nullopt;
  return std::move(shared->result);
}

}  // namespace drover
