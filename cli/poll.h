// The CLI's --wait loops (drover checkpoint, drain, suspend): ask the coordinator every
// 200 ms until the answer is final, or until --timeout S passed. Header-only: the CLI is a
// program.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>

namespace drover::cli {

// Calls `poll` until it returns an exit code, and returns that; once timeout_s (> 0; 0:
// never) has passed since the first call, returns what `timed_out` returns instead.
inline int PollUntil(double timeout_s, const std::function<std::optional<int>()>& poll,
                     const std::function<int()>& timed_out) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  for (;;) {
    if (std::optional<int> code = poll()) return *code;
    if (timeout_s > 0 && Clock::now() >= deadline) return timed_out();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace drover::cli
