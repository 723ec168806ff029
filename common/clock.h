// Time behind a small interface so that managers can be tested with a fake clock that
// tests advance by hand (they never sleep and hope).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace drover {

// Thread-safe. Times are milliseconds; Now() is monotonic, WallNowMs() is Unix time.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;      // monotonic, for timeouts
  virtual int64_t WallNowMs() const = 0;  // Unix epoch, for records people read
};

class SystemClock final : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  int64_t WallNowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static SystemClock* Get() {
    static SystemClock clock;
    return &clock;
  }
};

// Starts at `start_ms`; moves only when Advance/Set is called. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(); }
  int64_t WallNowMs() const override { return 1'700'000'000'000 + now_ms_.load(); }
  void AdvanceMs(int64_t ms) { now_ms_ += ms; }
  void SetMs(int64_t ms) { now_ms_ = ms; }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace drover
