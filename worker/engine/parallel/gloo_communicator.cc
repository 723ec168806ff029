#include "worker/engine/parallel/gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

#include "worker/engine/parallel/gloo_group.h"
#include "worker/engine/parallel/gloo_ring.h"

namespace drover::engine::parallel {
namespace {

using gloo::transport::UnboundBuffer;

// Point-to-point slots: the caller's tag under a prefix no collective uses (Gloo's are
// 0x01..0x08, the rings' 0x20 and 0x21, gloo_ring.cc), so a message never matches a
// collective's receive however the two interleave.
constexpr int kPointToPointPrefixShift = 56;
constexpr uint64_t kPointToPointPrefix = uint64_t{0x80} << kPointToPointPrefixShift;
constexpr uint64_t kMaxPointToPointTag = (uint64_t{1} << kPointToPointPrefixShift) - 1;

// gloo::rendezvous::Store over a KvStore, with one deadline for the whole connect: Gloo
// waits for each peer's key in turn, and the sum of its waits must not exceed the
// caller's connect timeout. Failures are thrown as KvStoreError (Gloo's Store has no other
// way), which GlooExceptionToStatus turns back into the store's own Status.
class KvGlooStore final : public gloo::rendezvous::Store {
 public:
  KvGlooStore(KvStore* store, GlooClock::time_point deadline)
      : store_(store), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status status = store_->Set(key, std::string(data.begin(), data.end()));
    if (!status.ok()) throw KvStoreError(std::move(status));
  }

  std::vector<char> get(const std::string& key) override {
    Fetch(key);
    return fetched_.at(key);
  }

  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) Fetch(key);
  }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);
  }

 private:
  // Reads `key` once (a wait and the get that follows it cost one round trip, not two).
  void Fetch(const std::string& key) {
    if (fetched_.count(key) > 0) return;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - GlooClock::now());
    StatusOr<std::string> value = store_->Get(key, std::max(left, std::chrono::milliseconds(0)));
    if (!value.ok()) throw KvStoreError(value.status());
    fetched_[key] = std::vector<char>(value->begin(), value->end());
  }

  KvStore* const store_;
  const GlooClock::time_point deadline_;
  std::map<std::string, std::vector<char>> fetched_;
};

// An Isend or Irecv in flight. Shares the group with its communicator; the buffer is
// declared after the group so that it goes first (Gloo buffers refer to the context).
class GlooRequest final : public Request {
 public:
  GlooRequest(std::shared_ptr<GlooGroup> group, std::unique_ptr<UnboundBuffer> buffer, bool is_send,
              int peer, GlooClock::time_point deadline)
      : group_(std::move(group)),
        buffer_(std::move(buffer)),
        is_send_(is_send),
        peer_(peer),
        deadline_(deadline) {}

  ~GlooRequest() override {
    if (!waited_) (void)Wait();
  }

  Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    GlooOp op{is_send_ ? "Isend" : "Irecv", peer_};
    status_ = group_->Run(op, [&] {
      const auto timeout = GlooGroup::Remaining(deadline_);
      const bool done = is_send_ ? buffer_->waitSend(timeout) : buffer_->waitRecv(timeout);
      if (!done) throw std::runtime_error("wait aborted");
    });
    return status_;
  }

 private:
  const std::shared_ptr<GlooGroup> group_;
  const std::unique_ptr<UnboundBuffer> buffer_;
  const bool is_send_;
  const int peer_;
  const GlooClock::time_point deadline_;
  bool waited_ = false;
  Status status_;
};

template <typename T>
gloo::AllreduceOptions::Func SumOf() {
  return static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>);
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<GlooTransport> transport, std::shared_ptr<GlooGroup> group)
      : transport_(std::move(transport)), group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return group_->name(); }
  std::chrono::milliseconds timeout() const override { return group_->timeout(); }
  double wait_seconds() const override { return group_->wait_seconds(); }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override {
    const uint32_t tag = group_->NextCollectiveTag();
    if (!group_->error().ok()) return group_->error();
    if (size() == 1 || count == 0) return OkStatus();
    GlooOp gloo_op{"AllReduce"};
    RETURN_IF_ERROR(group_->Run(gloo_op, [&] {
      gloo::AllreduceOptions options(group_->shared_context());
      options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      options.setTag(tag);
      options.setTimeout(timeout());
      if (type == DataType::kFloat32) {
        options.setOutput(static_cast<float*>(data), count);
        options.setReduceFunction(SumOf<float>());
      } else {
        options.setOutput(static_cast<double*>(data), count);
        options.setReduceFunction(SumOf<double>());
      }
      gloo::allreduce(options);
    }));
    // Every rank divides the same bits by the same number: the results stay identical.
    if (op == ReduceOp::kAverage) DivideInPlace(data, count, type, size());
    return OkStatus();
  }

  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp op) override {
    DROVER_CHECK_MSG(counts.size() == static_cast<size_t>(size()), "one count per rank");
    if (size() == 1) return OkStatus();
    return RingReduceScatter(*group_, data, counts, type, op, scratch_);
  }

  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    DROVER_CHECK_MSG(counts.size() == static_cast<size_t>(size()), "one count per rank");
    if (size() == 1) return OkStatus();
    return RingAllGather(*group_, data, counts, type);
  }

  Status Broadcast(void* data, size_t count, DataType type, int root) override {
    DROVER_CHECK_MSG(root >= 0 && root < size(), "broadcast root out of range");
    const uint32_t tag = group_->NextCollectiveTag();
    if (!group_->error().ok()) return group_->error();
    if (size() == 1 || count == 0) return OkStatus();
    GlooOp gloo_op{"Broadcast"};
    return group_->Run(gloo_op, [&] {
      gloo::BroadcastOptions options(group_->shared_context());
      options.setOutput(static_cast<uint8_t*>(data), count * SizeOf(type));
      options.setRoot(root);
      options.setTag(tag);
      options.setTimeout(timeout());
      gloo::broadcast(options);
    });
  }

  StatusOr<std::unique_ptr<Request>> Isend(const void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    // Gloo only reads the buffer of a send; its API has no const overload.
    return Post(const_cast<void*>(data), bytes, peer, tag, /*is_send=*/true);
  }

  StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    return Post(data, bytes, peer, tag, /*is_send=*/false);
  }

  Status Barrier() override {
    const uint32_t tag = group_->NextCollectiveTag();
    if (!group_->error().ok()) return group_->error();
    if (size() == 1) return OkStatus();
    GlooOp gloo_op{"Barrier"};
    return group_->Run(gloo_op, [&] {
      gloo::BarrierOptions options(group_->shared_context());
      options.setTag(tag);
      options.setTimeout(timeout());
      gloo::barrier(options);
    });
  }

 private:
  StatusOr<std::unique_ptr<Request>> Post(void* data, size_t bytes, int peer, uint64_t tag,
                                          bool is_send) {
    DROVER_CHECK_MSG(peer >= 0 && peer < size() && peer != rank(), "peer out of range");
    DROVER_CHECK_MSG(tag <= kMaxPointToPointTag, "point-to-point tags have 56 bits");
    const auto deadline = GlooClock::now() + timeout();
    if (!group_->error().ok()) return group_->error();
    const uint64_t slot = kPointToPointPrefix | tag;
    std::unique_ptr<UnboundBuffer> buffer;  // outlives Run's close on failure
    GlooOp gloo_op{is_send ? "Isend" : "Irecv", peer};
    RETURN_IF_ERROR(group_->Run(gloo_op, [&] {
      buffer = group_->context()->createUnboundBuffer(data, bytes);
      if (is_send) {
        buffer->send(peer, slot, 0, bytes);
      } else {
        buffer->recv(peer, slot, 0, bytes);
      }
    }));
    return std::unique_ptr<Request>(
        new GlooRequest(group_, std::move(buffer), is_send, peer, deadline));
  }

  const std::shared_ptr<GlooTransport> transport_;  // keeps the device (event loop) alive
  const std::shared_ptr<GlooGroup> group_;
  std::vector<std::byte> scratch_;  // ReduceScatter's receive buffer, grown as needed
};

}  // namespace

GlooTransport::GlooTransport(std::shared_ptr<gloo::transport::Device> device)
    : device_(std::move(device)) {}

StatusOr<std::shared_ptr<GlooTransport>> GlooTransport::Create(const std::string& bind_address) {
  gloo::transport::tcp::attr attr;
  attr.hostname = bind_address;
  try {
    return std::make_shared<GlooTransport>(gloo::transport::tcp::CreateDevice(attr));
  } catch (...) {
    return GlooExceptionToStatus(std::current_exception(),
                                 "gloo transport on \"" + bind_address + "\"");
  }
}

StatusOr<std::unique_ptr<Communicator>> ConnectGlooGroup(
    std::shared_ptr<GlooTransport> transport, KvStore* store, const std::string& group_name,
    int rank, int size, const CommOptions& options, std::chrono::milliseconds connect_timeout) {
  DROVER_CHECK_MSG(size >= 1 && rank >= 0 && rank < size, "rank out of range");
  std::shared_ptr<gloo::Context> context;
  if (size > 1) {
    DROVER_CHECK_MSG(transport != nullptr && store != nullptr, "a group needs transport and store");
    const GlooOp op{"Connect"};
    try {
      PrefixKvStore group_store(store, group_name + "/gloo");
      KvGlooStore gloo_store(&group_store, GlooClock::now() + connect_timeout);
      auto rendezvous = std::make_shared<gloo::rendezvous::Context>(rank, size);
      // Pairs take the context's timeout as their connect timeout when they are created.
      rendezvous->setTimeout(connect_timeout);
      std::shared_ptr<gloo::transport::Device> device = transport->device();
      rendezvous->connectFullMesh(gloo_store, device);
      rendezvous->setTimeout(options.timeout);
      context = std::move(rendezvous);
    } catch (...) {
      return GlooExceptionToStatus(std::current_exception(),
                                   DescribeGlooOp(group_name, rank, size, op));
    }
  }
  auto group =
      std::make_shared<GlooGroup>(group_name, rank, size, options.timeout, std::move(context));
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(std::move(transport), std::move(group)));
}

}  // namespace drover::engine::parallel
