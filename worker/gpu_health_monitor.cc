#include "worker/gpu_health_monitor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace drover {

std::string NvmlStallFault(const std::string& bus_id, int64_t waited_ms) {
  const std::string waited = waited_ms % 1000 == 0 ? std::to_string(waited_ms / 1000) + " s"
                                                   : std::to_string(waited_ms) + " ms";
  return "GPU " + bus_id + ": NVML has not answered a query about it within " + waited +
         " (a wedged driver or GPU): the node needs a GPU reset or a reboot";
}

namespace {
std::atomic<int> g_running_threads{0};
}  // namespace

int GpuHealthMonitor::RunningThreads() { return g_running_threads.load(); }

struct GpuHealthMonitor::State {
  State(std::unique_ptr<GpuHealthCheck> c, int interval, int timeout, const Clock* clk)
      : check(std::move(c)), interval_ms(interval), timeout_ms(timeout), clock(clk) {}

  const std::unique_ptr<GpuHealthCheck> check;  // CheckOne(i) from GPU i's thread alone
  const int interval_ms;
  const int timeout_ms;
  const Clock* const clock;

  struct Gpu {
    int index = 0;                          // in `check`
    int checks = 0;                         // finished
    bool querying = false;                  // a query is under way...
    int64_t since_ms = 0;                   // ...since then (clock ms)
    std::optional<v1::SlotHealth> finding;  // the last finished check's
    bool exited = false;                    // its thread is past its last use of `check`
  };
  Mutex mu;
  CondVar cv;
  bool stop GUARDED_BY(mu) = false;
  std::vector<Gpu> gpus GUARDED_BY(mu);  // those checked, each with a thread
};

GpuHealthMonitor::GpuHealthMonitor(std::unique_ptr<GpuHealthCheck> check, int interval_ms,
                                   int timeout_ms, const Clock* clock)
    : state_(std::make_shared<State>(std::move(check), interval_ms, timeout_ms, clock)) {
  size_t n = 0;
  {
    MutexLock lock(&state_->mu);
    for (int i = 0; i < state_->check->size(); ++i) {
      if (!state_->check->checked(i)) continue;
      State::Gpu& g = state_->gpus.emplace_back();
      g.index = i;
    }
    n = state_->gpus.size();
  }
  for (size_t g = 0; g < n; ++g) {
    ++g_running_threads;
    threads_.emplace_back(&GpuHealthMonitor::Loop, state_, static_cast<int>(g));
  }
}

GpuHealthMonitor::~GpuHealthMonitor() {
  std::vector<bool> exited;
  {
    MutexLock lock(&state_->mu);
    state_->stop = true;
    state_->cv.SignalAll();
    // A healthy query takes milliseconds.
    state_->cv.WaitFor(&state_->mu, std::chrono::seconds(2), [this]() REQUIRES(state_->mu) {
      return std::all_of(state_->gpus.begin(), state_->gpus.end(),
                         [](const State::Gpu& g) { return g.exited; });
    });
    for (const State::Gpu& g : state_->gpus) exited.push_back(g.exited);
  }
  for (size_t g = 0; g < threads_.size(); ++g) {
    if (exited[g]) {
      threads_[g].join();
    } else {
      threads_[g].detach();  // it holds its own reference to the state, NVML's library with it
    }
  }
}

void GpuHealthMonitor::Loop(std::shared_ptr<State> s, int gpu) {
  State* const st = s.get();
  int index = 0;
  {
    MutexLock lock(&st->mu);
    index = st->gpus[static_cast<size_t>(gpu)].index;
  }
  while (true) {
    {
      MutexLock lock(&st->mu);
      State::Gpu& g = st->gpus[static_cast<size_t>(gpu)];
      g.querying = true;
      g.since_ms = st->clock->NowMs();
    }
    std::optional<v1::SlotHealth> finding = st->check->CheckOne(index);
    MutexLock lock(&st->mu);
    State::Gpu& g = st->gpus[static_cast<size_t>(gpu)];
    g.querying = false;
    g.finding = std::move(finding);
    ++g.checks;
    st->cv.SignalAll();
    if (st->stop || st->cv.WaitFor(&st->mu, std::chrono::milliseconds(st->interval_ms),
                                   [st]() REQUIRES(st->mu) { return st->stop; })) {
      break;
    }
  }
  {
    MutexLock lock(&st->mu);
    st->gpus[static_cast<size_t>(gpu)].exited = true;
    st->cv.SignalAll();
  }
  s.reset();  // NVML shut down and unloaded here when the monitor and the other threads are gone
  --g_running_threads;
}

void GpuHealthMonitor::WaitForFirstRound() {
  MutexLock lock(&state_->mu);
  state_->cv.WaitFor(&state_->mu, std::chrono::milliseconds(state_->timeout_ms),
                     [this]() REQUIRES(state_->mu) {
                       return std::all_of(state_->gpus.begin(), state_->gpus.end(),
                                          [](const State::Gpu& g) { return g.checks > 0; });
                     });
}

std::vector<v1::SlotHealth> GpuHealthMonitor::Unfit() const {
  MutexLock lock(&state_->mu);
  const int64_t now = state_->clock->NowMs();
  std::vector<v1::SlotHealth> unfit;
  for (const State::Gpu& g : state_->gpus) {
    if (g.querying && now - g.since_ms >= state_->timeout_ms) {
      v1::SlotHealth& h = unfit.emplace_back();
      h.set_slot(state_->check->slot(g.index));
      h.set_fault(NvmlStallFault(state_->check->bus_id(g.index), state_->timeout_ms));
    } else if (g.finding) {
      unfit.push_back(*g.finding);
    }
  }
  return unfit;
}

}  // namespace drover
