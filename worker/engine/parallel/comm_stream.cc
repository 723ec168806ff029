#include "worker/engine/parallel/comm_stream.h"

#include <omp.h>

#include <chrono>
#include <optional>

#include "worker/engine/parallel/communicator.h"

namespace drover::engine::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// How often Wait asks whether a device has finished the caller's compute: the bound on the
// error of each stall it counts.
constexpr std::chrono::microseconds kProbeInterval{200};

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

CommStream::CommStream(std::string name, WorkMarks* compute)
    : name_(std::move(name)), compute_(compute), thread_([this] { Loop(); }) {}

CommStream::~CommStream() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

CommStream::Ticket CommStream::Submit(std::function<Status()> work) {
  Ticket t;
  {
    MutexLock lock(&mu_);
    t = next_ticket_++;
    queue_.emplace_back(t, std::move(work));
  }
  cv_.SignalAll();
  return t;
}

Status CommStream::Wait(Ticket ticket) {
  const auto t0 = Clock::now();
  MutexLock lock(&mu_);
  if (done_ < ticket) {
    // The rank stalls from when its own work has run out. On the CPU that is now: an op has
    // finished when it returns. A GPU may still be running the backward the work overlaps,
    // and the host cannot see it finish without asking: it asks every kProbeInterval until
    // it has (a work item done before then stalled nothing).
    std::optional<Clock::time_point> idle;
    if (compute_ == nullptr) {
      idle = t0;
    } else {
      compute_->MarkWork();
    }
    while (done_ < ticket) {
      if (!idle && compute_->MarkedWorkDone()) idle = Clock::now();
      if (idle) {
        cv_.Wait(&mu_);
      } else {
        cv_.WaitFor(&mu_, kProbeInterval);
      }
    }
    if (idle) blocked_s_ += SecondsSince(*idle);
  }
  if (failed_at_ != 0 && failed_at_ <= ticket) return error_;
  return OkStatus();
}

Status CommStream::WaitAll() {
  Ticket last;
  {
    MutexLock lock(&mu_);
    last = next_ticket_ - 1;
  }
  return Wait(last);
}

double CommStream::busy_seconds() const {
  MutexLock lock(&mu_);
  return busy_s_;
}

void CommStream::ResetTimes() {
  MutexLock lock(&mu_);
  busy_s_ = 0;
  blocked_s_ = 0;
}

void CommStream::Loop() {
  // Kernels this thread runs (shard accumulation) stay serial: the training thread's
  // OpenMP team already owns the cores.
  omp_set_num_threads(1);
  // Its collectives run beside the training thread's compute.
  OverlappedCalls::Enter(&left_uncounted_);
  MutexLock lock(&mu_);
  while (true) {
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    auto [ticket, work] = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = failed_at_ != 0;
    lock.Unlock();
    Status st;
    const auto t0 = Clock::now();
    if (!skip) st = work();
    const double busy = SecondsSince(t0);
    lock.Lock();
    busy_s_ += busy;
    if (!st.ok() && failed_at_ == 0) {
      failed_at_ = ticket;
      error_ = st.WithContext(name_);
    }
    done_ = ticket;
    cv_.SignalAll();
  }
}

}  // namespace drover::engine::parallel
