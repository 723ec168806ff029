// CoordinatorWatch: keeps the agent's WorkerService.Watch stream open (proto/drover.proto
// says what it is for) on a thread of its own, reopening it with back-off when it ends.
//
// on_event runs for every event (orders wait: heartbeat now); on_broken runs when an
// established stream ends (heartbeat now, so that the coordinator, which just saw the
// connection close, hears from this live agent within its connection grace). Both run on
// the watch thread and must not block.
//
// Thread-safety: Start() and Stop() from the owner's thread; Stop() is idempotent and is
// called by the destructor.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "proto/drover.grpc.pb.h"

namespace drover {

class CoordinatorWatch {
 public:
  using StubFn = std::function<std::shared_ptr<v1::WorkerService::Stub>()>;
  CoordinatorWatch(v1::WatchRequest request, StubFn stub, std::function<void()> on_event,
                   std::function<void()> on_broken, int64_t max_backoff_ms = 1000);
  ~CoordinatorWatch();

  void Start();
  void Stop();

 private:
  void Run();

  const v1::WatchRequest request_;
  const StubFn stub_;
  const std::function<void()> on_event_;
  const std::function<void()> on_broken_;
  const int64_t max_backoff_ms_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  grpc::ClientContext* call_ GUARDED_BY(mu_) = nullptr;  // the open call, to cancel it
  std::thread thread_;
};

}  // namespace drover
