// The Gloo backend of Communicator (communicator.h): TCP on host memory, for the CPU path
// and for the host-side groups of a GPU job.
//
// Algorithms: AllReduce is Gloo's ring all-reduce (kAverage: sum, then divide by size);
// Broadcast and Barrier are Gloo's; ReduceScatter and AllGather are pipelined rings of our
// own over Gloo's unbound buffers (gloo_ring.h); Isend / Irecv are unbound-buffer sends.
//
// Deadlines: Gloo applies a timeout to each wait inside its own algorithms, not to the
// whole call, so AllReduce, Broadcast and Barrier fail when no progress is made for
// CommOptions::timeout (a hung or dead peer is caught within the timeout of the stall); a
// peer that keeps progressing slowly can make them run longer. ReduceScatter, AllGather and
// requests count the timeout end to end from the call.
//
// Failures follow communicator.h; in addition, on its first error a communicator closes
// its connections, so its peers fail at once (Unavailable) instead of timing out.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/kv_store.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace drover::engine::parallel {

// One per process: a Gloo TCP device bound to one local address. Every group of the
// process connects through it (Gloo runs one event-loop thread per device). Thread-safe.
class GlooTransport {
 public:
  // `bind_address` is a local IP address or host name ("127.0.0.1" for one machine).
  static StatusOr<std::shared_ptr<GlooTransport>> Create(
      const std::string& bind_address = "127.0.0.1");

  const std::shared_ptr<gloo::transport::Device>& device() const { return device_; }

  explicit GlooTransport(std::shared_ptr<gloo::transport::Device> device);

 private:
  std::shared_ptr<gloo::transport::Device> device_;
};

// Connects rank `rank` of the group `group_name` (`size` ranks) to every other rank: each
// rank publishes its addresses in `store` under "<group_name>/gloo/" and reads the others',
// so many groups can share one store (group names must be unique within it). Returns
// within about `connect_timeout`: DeadlineExceeded (naming the missing key) when a peer
// does not show up. A group of size 1 needs neither transport nor store (they may be null)
// and its every call is a local no-op.
//
// The communicator keeps `transport` alive; `store` is used only during this call. Requests
// (Isend / Irecv) share the group's connections with their communicator, so either may be
// destroyed first.
StatusOr<std::unique_ptr<Communicator>> ConnectGlooGroup(std::shared_ptr<GlooTransport> transport,
                                                         KvStore* store,
                                                         const std::string& group_name, int rank,
                                                         int size, const CommOptions& options,
                                                         std::chrono::milliseconds connect_timeout);

}  // namespace drover::engine::parallel
