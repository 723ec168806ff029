// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with Clang's
// thread-safety annotations (common/thread_annotations.h), so that members declared
// GUARDED_BY(mu_) are checked at compile time (leveldb's port::Mutex / port::CondVar).
//
//   mutable Mutex mu_;
//   int pending_ GUARDED_BY(mu_) = 0;
//   CondVar cv_;
//   ...
//   MutexLock lock(&mu_);
//   while (pending_ > 0) cv_.Wait(&mu_);
//
// or, with a predicate, which the analysis checks as a function of its own and so must say
// that it runs with the lock held:
//
//   cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return pending_ == 0; });
//
// A wait without a predicate may return spuriously.
//
// Thread-safety: as std::mutex / std::condition_variable. Not recursive.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "common/thread_annotations.h"

namespace drover {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis the lock is held where it cannot know (a callback the holder calls).
  // Checks nothing at run time: std::mutex does not know its owner.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction; Unlock/Lock release and retake it inside
// that span (the destructor releases only if held).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases `mu`, blocks until woken (or spuriously), and holds `mu` again on return.
  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still held: the caller's
  }
  // As Wait, returning false once `deadline` has passed (true if woken before it).
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  // As Wait for at most `timeout`; false if it ran out.
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }

  // Waits until `done()` is true; `done` runs with `mu` held (declare it REQUIRES(mu_)).
  // The analysis checks `done`'s body, not this call of it: it cannot tell that `mu` here
  // is the mutex `done` names.
  template <typename Predicate>
  void Wait(Mutex* mu, Predicate done) REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock, std::move(done));
    lock.release();
  }
  // Waits until `done()` is true or `deadline` passes; returns `done()`'s last value.
  template <typename Clock, typename Duration, typename Predicate>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline, Predicate done)
      REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool result = cv_.wait_until(lock, deadline, std::move(done));
    lock.release();
    return result;
  }
  template <typename Rep, typename Period, typename Predicate>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Predicate done) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout, std::move(done));
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace drover
