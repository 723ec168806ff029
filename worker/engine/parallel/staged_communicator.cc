#include "worker/engine/parallel/staged_communicator.h"

#include <numeric>
#include <utility>
#include <vector>

#include "common/status.h"

namespace drover::engine::parallel {
namespace {

// Device buffers move as floats (Ops::ToHost / FromHost): every element type the engine
// sends is a whole number of floats.
size_t FloatsIn(size_t bytes) {
  DROVER_CHECK_MSG(bytes % sizeof(float) == 0, "a staged buffer is not a whole number of floats");
  return bytes / sizeof(float);
}

class StagedRequest final : public Request {
 public:
  // For a receive, `device` gets the staged bytes once the inner request completes.
  StagedRequest(std::unique_ptr<Request> inner, std::vector<float> host, Ops* ops, float* device)
      : inner_(std::move(inner)), host_(std::move(host)), ops_(ops), device_(device) {}
  ~StagedRequest() override {
    if (inner_ != nullptr) (void)Wait();
  }

  Status Wait() override {
    if (inner_ == nullptr) return status_;
    status_ = inner_->Wait();
    inner_.reset();
    if (status_.ok() && device_ != nullptr) ops_->FromHost(device_, host_.data(), host_.size());
    host_ = {};
    return status_;
  }

 private:
  std::unique_ptr<Request> inner_;
  std::vector<float> host_;
  Ops* ops_;
  float* device_;
  Status status_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, Ops* ops)
      : inner_(std::move(inner)), ops_(ops) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override {
    return Staged(data, count * SizeOf(type),
                  [&](void* host) { return inner_->AllReduce(host, count, type, op); });
  }
  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp op) override {
    return Staged(data, Total(counts) * SizeOf(type),
                  [&](void* host) { return inner_->ReduceScatter(host, counts, type, op); });
  }
  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    return Staged(data, Total(counts) * SizeOf(type),
                  [&](void* host) { return inner_->AllGather(host, counts, type); });
  }
  Status Broadcast(void* data, size_t count, DataType type, int root) override {
    return Staged(data, count * SizeOf(type),
                  [&](void* host) { return inner_->Broadcast(host, count, type, root); });
  }

  StatusOr<std::unique_ptr<Request>> Isend(const void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    if (!ops_->IsDeviceMemory(data)) return inner_->Isend(data, bytes, peer, tag);
    std::vector<float> host(FloatsIn(bytes));
    ops_->ToHost(host.data(), static_cast<const float*>(data), host.size());
    ASSIGN_OR_RETURN(std::unique_ptr<Request> inner, inner_->Isend(host.data(), bytes, peer, tag));
    // The vector's heap block does not move with it: the inner send keeps reading it.
    return std::unique_ptr<Request>(
        new StagedRequest(std::move(inner), std::move(host), ops_, nullptr));
  }
  StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    if (!ops_->IsDeviceMemory(data)) return inner_->Irecv(data, bytes, peer, tag);
    std::vector<float> host(FloatsIn(bytes));
    ASSIGN_OR_RETURN(std::unique_ptr<Request> inner, inner_->Irecv(host.data(), bytes, peer, tag));
    return std::unique_ptr<Request>(
        new StagedRequest(std::move(inner), std::move(host), ops_, static_cast<float*>(data)));
  }

  Status Barrier() override { return inner_->Barrier(); }

 private:
  static size_t Total(std::span<const size_t> counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }

  // Runs `call` on `data` itself when it is host memory, else on a host copy of its
  // `bytes` that is copied back afterwards (also after a failure: the communicator is
  // broken then, and the buffer's contents do not matter).
  template <typename Call>
  Status Staged(void* data, size_t bytes, Call call) {
    if (bytes == 0 || !ops_->IsDeviceMemory(data)) return call(data);
    const size_t n = FloatsIn(bytes);
    // Page-locked on CUDA (Ops::host_allocator), and slow to allocate there: grown to the
    // largest bucket once, then reused by every call.
    if (staging_.size() < n) staging_ = Buffer(ops_->host_allocator(), n);
    float* device = static_cast<float*>(data);
    ops_->ToHost(staging_.data(), device, n);
    Status st = call(staging_.data());
    if (st.ok()) ops_->FromHost(device, staging_.data(), n);
    return st;
  }

  std::unique_ptr<Communicator> inner_;
  Ops* ops_;
  Buffer staging_;
};

}  // namespace

std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> inner, Ops* ops) {
  return std::make_unique<StagedCommunicator>(std::move(inner), ops);
}

}  // namespace drover::engine::parallel
