#include "worker/gpu_health_monitor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <random>
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

// How long the Xid thread waits in NVML at a time: the longest a monitor's end waits for it.
constexpr int kXidWaitMs = 100;
}  // namespace

int GpuHealthMonitor::RunningThreads() { return g_running_threads.load(); }

struct GpuHealthMonitor::State {
  State(std::unique_ptr<GpuHealthCheck> c, Options o, const Clock* clk)
      : check(std::move(c)),
        interval_ms(o.interval_ms),
        timeout_ms(o.timeout_ms),
        ignored_xids(std::move(o.ignored_xids)),
        clock(clk) {}

  // CheckOne(i) from GPU i's thread alone, WaitForXid from the Xid thread alone.
  const std::unique_ptr<GpuHealthCheck> check;
  const int interval_ms;
  const int timeout_ms;
  const std::vector<int> ignored_xids;
  const Clock* const clock;

  struct Gpu {
    int index = 0;                              // in `check`
    int checks = 0;                             // finished
    bool querying = false;                      // a query is under way...
    int64_t since_ms = 0;                       // ...since then (clock ms)
    std::optional<v1::SlotHealth> finding;      // the last finished check's
    std::optional<std::string> xid_fault;       // its first critical Xid's, kept until cleared
    int64_t xid_latch = 0;                      // xid_fault's id (SlotHealth.latch)
    std::optional<v1::GpuTelemetry> telemetry;  // the last finished check's reading
    bool exited = false;                        // its thread is past its last use of `check`
  };
  Mutex mu;
  CondVar cv;
  bool stop GUARDED_BY(mu) = false;
  std::vector<Gpu> gpus GUARDED_BY(mu);    // those checked, each with a thread
  bool xids_exited GUARDED_BY(mu) = true;  // the Xid thread, where there is one, likewise
  // Latch ids: random, so that one never names another agent process's finding.
  std::mt19937_64 latch_ids GUARDED_BY(mu){std::random_device{}()};
};

GpuHealthMonitor::GpuHealthMonitor(std::unique_ptr<GpuHealthCheck> check, Options options,
                                   const Clock* clock)
    : state_(std::make_shared<State>(std::move(check), std::move(options), clock)) {
  size_t n = 0;
  const bool xids = state_->check->watches_xids();
  {
    MutexLock lock(&state_->mu);
    for (int i = 0; i < state_->check->size(); ++i) {
      if (!state_->check->checked(i)) continue;
      State::Gpu& g = state_->gpus.emplace_back();
      g.index = i;
    }
    n = state_->gpus.size();
    state_->xids_exited = !xids;
  }
  for (size_t g = 0; g < n; ++g) {
    ++g_running_threads;
    threads_.emplace_back(&GpuHealthMonitor::Loop, state_, static_cast<int>(g));
  }
  if (xids) {
    ++g_running_threads;
    threads_.emplace_back(&GpuHealthMonitor::WatchXids, state_);
  }
}

GpuHealthMonitor::~GpuHealthMonitor() {
  std::vector<bool> exited;
  {
    MutexLock lock(&state_->mu);
    state_->stop = true;
    state_->cv.SignalAll();
    // A healthy query takes milliseconds; the Xid thread's wait, kXidWaitMs.
    state_->cv.WaitFor(&state_->mu, std::chrono::seconds(2), [this]() REQUIRES(state_->mu) {
      return state_->xids_exited && std::all_of(state_->gpus.begin(), state_->gpus.end(),
                                                [](const State::Gpu& g) { return g.exited; });
    });
    for (const State::Gpu& g : state_->gpus) exited.push_back(g.exited);
    exited.push_back(state_->xids_exited);  // read only where that thread exists
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
    std::optional<v1::GpuTelemetry> telemetry = st->check->Telemetry(index);
    MutexLock lock(&st->mu);
    State::Gpu& g = st->gpus[static_cast<size_t>(gpu)];
    g.querying = false;
    g.finding = std::move(finding);
    g.telemetry = std::move(telemetry);
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

void GpuHealthMonitor::WatchXids(std::shared_ptr<State> s) {
  State* const st = s.get();
  while (true) {
    {
      MutexLock lock(&st->mu);
      if (st->stop) break;
    }
    const std::optional<XidEvent> event = st->check->WaitForXid(kXidWaitMs);
    if (!event) continue;
    const std::string on =
        event->gpu >= 0 ? "GPU " + st->check->bus_id(event->gpu) : "a GPU NVML did not name";
    if (std::find(st->ignored_xids.begin(), st->ignored_xids.end(),
                  static_cast<int64_t>(event->xid)) != st->ignored_xids.end()) {
      spdlog::info(
          "Xid {} on {} (an NVML event): an application's fault, not the GPU's "
          "(--gpu-ignored-xids); the GPU stays in use",
          event->xid, on);
      continue;
    }
    if (event->gpu < 0) {
      spdlog::warn("Xid {} on {} (an NVML event): every GPU of this node is taken out", event->xid,
                   on);
    }
    MutexLock lock(&st->mu);
    for (State::Gpu& g : st->gpus) {
      if (event->gpu >= 0 && g.index != event->gpu) continue;
      if (g.xid_fault) {
        spdlog::warn("GPU {}: Xid {} as well (an NVML event)", st->check->bus_id(g.index),
                     event->xid);
        continue;
      }
      g.xid_fault = XidFault(st->check->bus_id(g.index), event->xid, st->clock->WallNowMs());
      do {
        g.xid_latch = static_cast<int64_t>(st->latch_ids() >> 1);
      } while (g.xid_latch == 0);
      spdlog::error("{}", *g.xid_fault);
    }
  }
  {
    MutexLock lock(&st->mu);
    st->xids_exited = true;
    st->cv.SignalAll();
  }
  s.reset();
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
    if (g.xid_fault) {
      v1::SlotHealth& h = unfit.emplace_back();
      h.set_slot(state_->check->slot(g.index));
      h.set_fault(*g.xid_fault);
      h.set_latch(g.xid_latch);
    } else if (g.querying && now - g.since_ms >= state_->timeout_ms) {
      v1::SlotHealth& h = unfit.emplace_back();
      h.set_slot(state_->check->slot(g.index));
      h.set_fault(NvmlStallFault(state_->check->bus_id(g.index), state_->timeout_ms));
    } else if (g.finding) {
      unfit.push_back(*g.finding);
    }
  }
  return unfit;
}

void GpuHealthMonitor::ClearLatches(std::span<const int64_t> latches) {
  MutexLock lock(&state_->mu);
  for (State::Gpu& g : state_->gpus) {
    if (!g.xid_fault || std::find(latches.begin(), latches.end(), g.xid_latch) == latches.end()) {
      continue;
    }
    spdlog::info("GPU {}: back in use, an operator having put its slot back (drover uncordon): {}",
                 state_->check->bus_id(g.index), *g.xid_fault);
    g.xid_fault.reset();
    g.xid_latch = 0;
  }
}

std::vector<v1::GpuTelemetry> GpuHealthMonitor::Telemetry() const {
  MutexLock lock(&state_->mu);
  const int64_t now = state_->clock->NowMs();
  std::vector<v1::GpuTelemetry> readings;
  for (const State::Gpu& g : state_->gpus) {
    const bool overdue = g.querying && now - g.since_ms >= state_->timeout_ms;
    if (g.telemetry && !overdue) readings.push_back(*g.telemetry);
  }
  return readings;
}

}  // namespace drover
