#include "worker/engine/parallel/comm_stream.h"

#include <omp.h>

#include <chrono>

#include "worker/engine/parallel/communicator.h"

namespace drover::engine::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

CommStream::CommStream(std::string name) : name_(std::move(name)), thread_([this] { Loop(); }) {}

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
  cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return done_ >= ticket; });
  blocked_s_ += SecondsSince(t0);
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
  OverlappedCalls::Enter(&host_timed_);
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
