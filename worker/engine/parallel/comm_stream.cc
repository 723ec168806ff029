#include "worker/engine/parallel/comm_stream.h"

#include <omp.h>

#include <chrono>

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
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

CommStream::Ticket CommStream::Submit(std::function<Status()> work) {
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    t = next_ticket_++;
    queue_.emplace_back(t, std::move(work));
  }
  cv_.notify_all();
  return t;
}

Status CommStream::Wait(Ticket ticket) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  blocked_s_ += SecondsSince(t0);
  if (failed_at_ != 0 && failed_at_ <= ticket) return error_;
  return OkStatus();
}

Status CommStream::WaitAll() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = next_ticket_ - 1;
  }
  return Wait(last);
}

double CommStream::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_;
}

void CommStream::ResetTimes() {
  std::lock_guard<std::mutex> lock(mu_);
  busy_s_ = 0;
  blocked_s_ = 0;
}

void CommStream::Loop() {
  // Kernels this thread runs (shard accumulation) stay serial: the training thread's
  // OpenMP team already owns the cores.
  omp_set_num_threads(1);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    auto [ticket, work] = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = failed_at_ != 0;
    lock.unlock();
    Status st;
    const auto t0 = Clock::now();
    if (!skip) st = work();
    const double busy = SecondsSince(t0);
    lock.lock();
    busy_s_ += busy;
    if (!st.ok() && failed_at_ == 0) {
      failed_at_ = ticket;
      error_ = st.WithContext(name_);
    }
    done_ = ticket;
    cv_.notify_all();
  }
}

}  // namespace drover::engine::parallel
