// AgentWatches: the coordinator's side of WorkerService.Watch, one long-lived stream per
// registered agent (proto/drover.proto says why it exists).
//
// Served on gRPC's callback API: an open stream is a reactor object and no thread, so
// 10,000 agents cost memory, not threads. When an agent's connection closes, gRPC cancels
// its stream (OnCancel) and the coordinator starts the node's short connection grace
// (Coordinator::WatchClosed). Nudge() writes one event to a node's stream, coalescing
// nudges that come while a write is in flight.
//
// Thread-safety: every method may be called from any thread. Nudge() takes only this
// registry's lock and the stream's, never the coordinator's, so the coordinator calls it
// under its state lock; the streams call the coordinator with neither lock held.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "coordinator/coordinator.h"
#include "proto/drover.grpc.pb.h"

namespace drover::coordinator {

class AgentWatches {
 public:
  explicit AgentWatches(Coordinator* coordinator) : coordinator_(coordinator) {}

  // A new stream for `request` (owned by gRPC; deleted when done). Refused with
  // FAILED_PRECONDITION when the agent is not registered.
  grpc::ServerWriteReactor<v1::WatchEvent>* Open(const v1::WatchRequest& request);

  // Tells the agent of `node` that orders wait for it; nothing when it has no stream.
  void Nudge(const std::string& node);

  class Stream;

 private:
  friend class Stream;
  void Remove(const std::string& node, Stream* stream);

  Coordinator* const coordinator_;
  Mutex mu_;
  std::unordered_map<std::string, Stream*> streams_ GUARDED_BY(mu_);  // the newest per node
};

}  // namespace drover::coordinator
