#include "worker/coordinator_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace drover {

CoordinatorWatch::CoordinatorWatch(v1::WatchRequest request, StubFn stub,
                                   std::function<void()> on_event, std::function<void()> on_broken,
                                   int64_t max_backoff_ms)
    : request_(std::move(request)),
      stub_(std::move(stub)),
      on_event_(std::move(on_event)),
      on_broken_(std::move(on_broken)),
      max_backoff_ms_(max_backoff_ms) {}

CoordinatorWatch::~CoordinatorWatch() { Stop(); }

void CoordinatorWatch::Start() {
  thread_ = std::thread([this] { Run(); });
}

void CoordinatorWatch::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    if (call_ != nullptr) call_->TryCancel();
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void CoordinatorWatch::Run() {
  int64_t backoff_ms = 100;
  while (true) {
    grpc::ClientContext ctx;
    {
      MutexLock lock(&mu_);
      if (stop_) return;
      call_ = &ctx;
    }
    // Held for the call: the agent may replace its channel meanwhile.
    std::shared_ptr<v1::WorkerService::Stub> stub = stub_();
    std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader = stub->Watch(&ctx, request_);
    bool established = false;
    v1::WatchEvent event;
    while (reader->Read(&event)) {
      established = true;
      on_event_();
    }
    const grpc::Status status = reader->Finish();
    {
      MutexLock lock(&mu_);
      call_ = nullptr;
      if (stop_) return;
    }
    if (established) {
      spdlog::debug("watch stream ended ({}); reopening", status.error_message());
      on_broken_();
      backoff_ms = 100;
    }
    MutexLock lock(&mu_);
    if (cv_.WaitFor(&mu_, std::chrono::milliseconds(backoff_ms),
                    [this]() REQUIRES(mu_) { return stop_; })) {
      return;
    }
    backoff_ms = std::min(backoff_ms * 2, max_backoff_ms_);
  }
}

}  // namespace drover
