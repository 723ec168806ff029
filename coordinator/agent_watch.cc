#include "coordinator/agent_watch.h"

#include "common/mutex.h"
#include "coordinator/grpc_status.h"

namespace drover::coordinator {

class AgentWatches::Stream : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  Stream(AgentWatches* owner, v1::WatchRequest request)
      : owner_(owner), request_(std::move(request)) {
    event_.set_orders_waiting(true);
  }

  // Once the agent is known to be registered. The first event tells it its stream is up
  // (and to heartbeat, which is harmless).
  void Start() {
    {
      MutexLock lock(&mu_);
      started_ = true;
    }
    Write();
  }

  void Write() {
    MutexLock lock(&mu_);
    if (!started_ || finished_) return;
    if (writing_) {
      again_ = true;
      return;
    }
    writing_ = true;
    StartWrite(&event_);
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    if (!ok || finished_ || !again_) {
      writing_ = false;
      return;
    }
    again_ = false;
    StartWrite(&event_);
  }

  // The agent cancelled or its connection closed (also on the server's shutdown).
  void OnCancel() override {
    owner_->coordinator_->WatchClosed(request_);
    MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    owner_->Remove(request_.name(), this);
    delete this;
  }

  void Refuse(const grpc::Status& status) {
    MutexLock lock(&mu_);
    finished_ = true;
    Finish(status);
  }

 private:
  AgentWatches* const owner_;
  const v1::WatchRequest request_;
  v1::WatchEvent event_;  // the same event each time: written only while !writing_
  Mutex mu_;
  bool started_ GUARDED_BY(mu_) = false;   // accepted; writes may start
  bool writing_ GUARDED_BY(mu_) = false;   // a StartWrite is in flight
  bool again_ GUARDED_BY(mu_) = false;     // a nudge came during it
  bool finished_ GUARDED_BY(mu_) = false;  // Finish was called; no more writes
};

grpc::ServerWriteReactor<v1::WatchEvent>* AgentWatches::Open(const v1::WatchRequest& request) {
  auto* stream = new Stream(this, request);
  // Listed before anything can end it, so that OnDone always finds what it removes. The
  // coordinator is asked with this registry's lock released (it nudges under its own).
  {
    MutexLock lock(&mu_);
    streams_[request.name()] = stream;
  }
  if (Status st = coordinator_->WatchOpened(request); !st.ok()) {
    stream->Refuse(ToGrpcStatus(st));
  } else {
    stream->Start();
  }
  return stream;
}

void AgentWatches::Nudge(const std::string& node) {
  MutexLock lock(&mu_);
  auto it = streams_.find(node);
  if (it != streams_.end()) it->second->Write();
}

void AgentWatches::Remove(const std::string& node, Stream* stream) {
  MutexLock lock(&mu_);
  auto it = streams_.find(node);
  if (it != streams_.end() && it->second == stream) streams_.erase(it);
}

}  // namespace drover::coordinator
