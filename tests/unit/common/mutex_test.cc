#include "common/mutex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

namespace drover {
namespace {

using std::chrono::milliseconds;

// A counter guarded as the code's classes guard their state.
class Counter {
 public:
  void Add(int n) {
    {
      MutexLock lock(&mu_);
      value_ += n;
    }
    changed_.SignalAll();
  }
  // Waits until value_ >= target; returns the value seen.
  int WaitFor(int target) {
    MutexLock lock(&mu_);
    changed_.Wait(&mu_, [&]() REQUIRES(mu_) { return value_ >= target; });
    return value_;
  }
  bool WaitAtMost(int target, milliseconds timeout) {
    MutexLock lock(&mu_);
    return changed_.WaitFor(&mu_, timeout, [&]() REQUIRES(mu_) { return value_ >= target; });
  }
  // Releases the lock in the middle, so `during` can take it.
  int AddAroundUnlocked(const std::function<void()>& during) {
    MutexLock lock(&mu_);
    ++value_;
    lock.Unlock();
    during();
    lock.Lock();
    return ++value_;
  }
  Mutex* mu() { return &mu_; }

 private:
  Mutex mu_;
  CondVar changed_;
  int value_ GUARDED_BY(mu_) = 0;
};

TEST(MutexTest, PredicateWaitReturnsOnceAnotherThreadMakesItTrue) {
  Counter c;
  std::thread adder([&] {
    for (int i = 0; i < 5; ++i) c.Add(1);
  });
  EXPECT_GE(c.WaitFor(5), 5);
  adder.join();
}

TEST(MutexTest, TimedPredicateWaitGivesFalseWhenItNeverHolds) {
  Counter c;
  c.Add(1);
  EXPECT_FALSE(c.WaitAtMost(2, milliseconds(20)));
  EXPECT_TRUE(c.WaitAtMost(1, milliseconds(0)));  // already true: no wait at all
}

TEST(MutexTest, UnlockInsideTheScopeLetsAnotherThreadTakeTheLock) {
  Counter c;
  bool other_ran = false;
  const int value = c.AddAroundUnlocked([&] {
    std::thread other([&] {
      MutexLock lock(c.mu());  // would deadlock if Unlock had not released it
      other_ran = true;
    });
    other.join();
  });
  EXPECT_TRUE(other_ran);
  EXPECT_EQ(value, 2);
  // The destructor released the retaken lock: it can be taken again here.
  MutexLock again(c.mu());
}

TEST(MutexTest, WaitUntilADeadlineInThePastReturnsAtOnce) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(cv.WaitUntil(&mu, start - milliseconds(1)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace drover
