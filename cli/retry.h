// Retrying the CLI's calls that are safe to repeat (every read, a cancel, and a submit,
// which carries a request id the coordinator deduplicates by) while the coordinator is
// UNAVAILABLE: down, restarting, or too busy to finish a connection set-up in time (200
// submits at once on a 2-core machine). The delay doubles from first_delay_ms up to
// max_delay_ms, each one scaled by a jitter in [0.5, 1] so that clients that failed
// together do not all come back together; no try starts past the deadline.
//
// Header-only, with time and sleep injected (RetryEnv), so that tests/unit/cli runs it on
// a fake clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <thread>

#include "common/status.h"

namespace drover::cli {

struct RetryPolicy {
  int64_t deadline_ms = 15'000;  // no try starts later than this after the first one
  int64_t first_delay_ms = 100;
  int64_t max_delay_ms = 2'000;
};

struct RetryEnv {
  std::function<int64_t()> now_ms;
  std::function<void(int64_t ms)> sleep_ms;
  std::function<double()> jitter;  // in [0.5, 1]

  static RetryEnv Real() {
    auto rng = std::make_shared<std::mt19937_64>(std::random_device{}());
    return {[] {
              return std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                  .count();
            },
            [](int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); },
            [rng] { return std::uniform_real_distribution<double>(0.5, 1.0)(*rng); }};
  }
};

// The growing delays between tries.
class Backoff {
 public:
  explicit Backoff(const RetryPolicy& policy) : policy_(policy), next_(policy.first_delay_ms) {}
  int64_t Next(const RetryEnv& env) {
    const int64_t delay = std::max<int64_t>(1, static_cast<int64_t>(next_ * env.jitter()));
    next_ = std::min(next_ * 2, policy_.max_delay_ms);
    return delay;
  }

 private:
  const RetryPolicy policy_;
  int64_t next_;
};

// Calls `call` until it returns anything but UNAVAILABLE, or until the next try would
// start past the deadline; returns the last outcome.
inline Status Retry(const RetryPolicy& policy, const RetryEnv& env,
                    const std::function<Status()>& call) {
  const int64_t deadline = env.now_ms() + policy.deadline_ms;
  Backoff backoff(policy);
  for (;;) {
    Status st = call();
    if (st.code() != StatusCode::kUnavailable) return st;
    const int64_t delay = backoff.Next(env);
    if (env.now_ms() + delay > deadline) return st;
    env.sleep_ms(delay);
  }
}

}  // namespace drover::cli
