#include "worker/gpu_health_monitor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
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

  const std::unique_ptr<GpuHealthCheck> check;  // used by the thread alone
  const int interval_ms;
  const int timeout_ms;
  const Clock* const clock;

  Mutex mu;
  CondVar cv;
  bool stop GUARDED_BY(mu) = false;
  bool exited GUARDED_BY(mu) = false;                // the thread is past its last use of `check`
  int rounds GUARDED_BY(mu) = 0;                     // finished
  std::vector<v1::SlotHealth> unfit GUARDED_BY(mu);  // the last finished round's
  // The query under way: its slot (-1: none), its GPU and when it began (clock ms).
  int querying_slot GUARDED_BY(mu) = -1;
  std::string querying_bus_id GUARDED_BY(mu);
  int64_t querying_since_ms GUARDED_BY(mu) = 0;
};

GpuHealthMonitor::GpuHealthMonitor(std::unique_ptr<GpuHealthCheck> check, int interval_ms,
                                   int timeout_ms, const Clock* clock)
    : state_(std::make_shared<State>(std::move(check), interval_ms, timeout_ms, clock)),
      thread_((++g_running_threads, std::thread(&GpuHealthMonitor::Loop, state_))) {}

GpuHealthMonitor::~GpuHealthMonitor() {
  bool exited = false;
  {
    MutexLock lock(&state_->mu);
    state_->stop = true;
    state_->cv.SignalAll();
    // A round of healthy queries takes milliseconds.
    exited = state_->cv.WaitFor(&state_->mu, std::chrono::seconds(2),
                                [this]() REQUIRES(state_->mu) { return state_->exited; });
  }
  if (exited) {
    thread_.join();
  } else {
    thread_.detach();  // it holds its own reference to the state, NVML's library with it
  }
}

void GpuHealthMonitor::Loop(std::shared_ptr<State> s) {
  State* const st = s.get();
  while (true) {
    std::vector<v1::SlotHealth> unfit = st->check->Check([st](int slot, const std::string& bus_id) {
      MutexLock lock(&st->mu);
      st->querying_slot = slot;
      st->querying_bus_id = bus_id;
      st->querying_since_ms = st->clock->NowMs();
    });
    MutexLock lock(&st->mu);
    st->querying_slot = -1;
    st->unfit = std::move(unfit);
    ++st->rounds;
    st->cv.SignalAll();
    if (st->stop || st->cv.WaitFor(&st->mu, std::chrono::milliseconds(st->interval_ms),
                                   [st]() REQUIRES(st->mu) { return st->stop; })) {
      break;
    }
  }
  {
    MutexLock lock(&st->mu);
    st->exited = true;
    st->cv.SignalAll();
  }
  s.reset();  // NVML shut down and unloaded here when the monitor is gone
  --g_running_threads;
}

void GpuHealthMonitor::WaitForFirstRound() {
  MutexLock lock(&state_->mu);
  state_->cv.WaitFor(&state_->mu, std::chrono::milliseconds(state_->timeout_ms),
                     [this]() REQUIRES(state_->mu) { return state_->rounds > 0; });
}

std::vector<v1::SlotHealth> GpuHealthMonitor::Unfit() const {
  MutexLock lock(&state_->mu);
  std::vector<v1::SlotHealth> unfit = state_->unfit;
  const int slot = state_->querying_slot;
  if (slot >= 0 && state_->clock->NowMs() - state_->querying_since_ms >= state_->timeout_ms) {
    std::erase_if(unfit, [slot](const v1::SlotHealth& h) { return h.slot() == slot; });
    v1::SlotHealth& h = unfit.emplace_back();
    h.set_slot(slot);
    h.set_fault(NvmlStallFault(state_->querying_bus_id, state_->timeout_ms));
    std::sort(unfit.begin(), unfit.end(),
              [](const v1::SlotHealth& a, const v1::SlotHealth& b) { return a.slot() < b.slot(); });
  }
  return unfit;
}

}  // namespace drover
