#include "worker/engine/parallel/staged_communicator.h"

#include <numeric>
#include <utility>
#include <vector>

#include "common/status.h"

namespace drover::engine::parallel {
namespace {

// Buffers move as floats (Ops::ToHost / FromHost): every element type the engine sends is a
// whole number of floats.
size_t FloatsIn(size_t bytes) {
  DROVER_CHECK_MSG(bytes % sizeof(float) == 0, "a staged buffer is not a whole number of floats");
  return bytes / sizeof(float);
}

// Where the inner communicator's buffers live.
enum class Side { kHost, kDevice };

// Memory of one side: a pageable vector on the host, or a Buffer of the table's allocator.
class Staging {
 public:
  Staging(Side side, Ops* ops, size_t n) : side_(side) {
    if (side == Side::kHost) {
      host_.resize(n);
    } else {
      device_ = ops->Allocate(n);
    }
  }
  float* data() { return side_ == Side::kHost ? host_.data() : device_.data(); }
  size_t size() const { return side_ == Side::kHost ? host_.size() : device_.size(); }

 private:
  Side side_;
  std::vector<float> host_;
  Buffer device_;
};

// Copies n floats from the caller's buffer into staging memory on `side`, or back.
void StageIn(Ops* ops, Side side, float* staged, const float* caller, size_t n) {
  if (side == Side::kHost) {
    ops->ToHost(staged, caller, n);
  } else {
    ops->FromHost(staged, caller, n);
  }
}
void StageOut(Ops* ops, Side side, float* caller, const float* staged, size_t n) {
  if (side == Side::kHost) {
    ops->FromHost(caller, staged, n);
  } else {
    ops->ToHost(caller, staged, n);
  }
}

class StagedRequest final : public Request {
 public:
  // For a receive, `destination` gets the staged bytes once the inner request completes.
  // `group` (the inner requests's) must outlive the request.
  StagedRequest(Communicator* group, std::unique_ptr<Request> inner, Staging staged, Ops* ops,
                Side side, float* destination)
      : group_(group),
        inner_(std::move(inner)),
        staged_(std::move(staged)),
        ops_(ops),
        side_(side),
        destination_(destination) {}
  ~StagedRequest() override {
    if (inner_ != nullptr) (void)Wait();
  }

  Status Wait() override {
    if (inner_ == nullptr) return status_;
    status_ = inner_->Wait();
    inner_.reset();
    // The staged buffer is the host's again (read, or released) only once a stream-ordered
    // transfer has completed.
    if (status_.ok() && side_ == Side::kDevice) status_ = group_->Sync();
    if (status_.ok() && destination_ != nullptr) {
      StageOut(ops_, side_, destination_, staged_.data(), staged_.size());
    }
    staged_ = Staging(side_, ops_, 0);
    return status_;
  }

 private:
  Communicator* const group_;
  std::unique_ptr<Request> inner_;
  Staging staged_;
  Ops* ops_;
  Side side_;
  float* destination_;
  Status status_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> inner, Ops* ops, Side side)
      : inner_(std::move(inner)), ops_(ops), side_(side) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  // The host group's time: copying in and out of device memory waits for this rank's own
  // kernels, which is not waiting for the peers.
  double wait_seconds() const override { return inner_->wait_seconds(); }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override {
    return Staged(data, count * SizeOf(type),
                  [&](void* inner) { return inner_->AllReduce(inner, count, type, op); });
  }
  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp op) override {
    return Staged(data, Total(counts) * SizeOf(type),
                  [&](void* inner) { return inner_->ReduceScatter(inner, counts, type, op); });
  }
  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    return Staged(data, Total(counts) * SizeOf(type),
                  [&](void* inner) { return inner_->AllGather(inner, counts, type); });
  }
  Status Broadcast(void* data, size_t count, DataType type, int root) override {
    return Staged(data, count * SizeOf(type),
                  [&](void* inner) { return inner_->Broadcast(inner, count, type, root); });
  }

  StatusOr<std::unique_ptr<Request>> Isend(const void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    if (bytes == 0 || OnInnerSide(data)) return inner_->Isend(data, bytes, peer, tag);
    Staging staged(side_, ops_, FloatsIn(bytes));
    StageIn(ops_, side_, staged.data(), static_cast<const float*>(data), staged.size());
    ASSIGN_OR_RETURN(std::unique_ptr<Request> inner,
                     inner_->Isend(staged.data(), bytes, peer, tag));
    // The staged memory does not move with the Staging: the inner send keeps reading it.
    return std::unique_ptr<Request>(
        new StagedRequest(inner_.get(), std::move(inner), std::move(staged), ops_, side_, nullptr));
  }
  StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int peer,
                                           uint64_t tag) override {
    if (bytes == 0 || OnInnerSide(data)) return inner_->Irecv(data, bytes, peer, tag);
    Staging staged(side_, ops_, FloatsIn(bytes));
    ASSIGN_OR_RETURN(std::unique_ptr<Request> inner,
                     inner_->Irecv(staged.data(), bytes, peer, tag));
    return std::unique_ptr<Request>(new StagedRequest(
        inner_.get(), std::move(inner), std::move(staged), ops_, side_, static_cast<float*>(data)));
  }

  Status Barrier() override {
    mark_ = nullptr;
    return inner_->Barrier();
  }
  Status Sync() override { return inner_->Sync(); }

  std::shared_ptr<const ComputeMark> MarkCompute() override { return inner_->MarkCompute(); }
  void FollowMark(std::shared_ptr<const ComputeMark> mark) override { mark_ = std::move(mark); }

 private:
  static size_t Total(std::span<const size_t> counts) {
    return std::accumulate(counts.begin(), counts.end(), size_t{0});
  }

  bool OnInnerSide(const void* data) const {
    return ops_->IsDeviceMemory(data) == (side_ == Side::kDevice);
  }

  // Runs `call` on `data` itself when it is memory of the inner's side, else on a staged
  // copy of its `bytes` that is copied back afterwards (not after a failure: the
  // communicator is broken then, and the buffer's contents do not matter).
  //
  // FollowMark's mark goes to the inner with a buffer that passes straight through; a staged
  // copy is made at the call, after the mark, so the inner then orders at the call.
  template <typename Call>
  Status Staged(void* data, size_t bytes, Call call) {
    std::shared_ptr<const ComputeMark> mark = std::move(mark_);
    mark_ = nullptr;
    if (bytes == 0 || OnInnerSide(data)) {
      inner_->FollowMark(std::move(mark));
      return call(data);
    }
    const size_t n = FloatsIn(bytes);
    // Page-locked host memory or device memory, both slow to allocate: grown to the largest
    // bucket once, then reused by every call.
    if (staging_.size() < n) {
      staging_ = Buffer(side_ == Side::kHost ? ops_->host_allocator() : ops_->allocator(), n);
    }
    auto* caller = static_cast<float*>(data);
    StageIn(ops_, side_, staging_.data(), caller, n);
    Status st = call(staging_.data());
    // The host reads the result at once: a stream-ordered inner call must have completed.
    if (st.ok() && side_ == Side::kDevice) st = inner_->Sync();
    if (st.ok()) StageOut(ops_, side_, caller, staging_.data(), n);
    return st;
  }

  std::unique_ptr<Communicator> inner_;
  Ops* ops_;
  const Side side_;
  Buffer staging_;
  std::shared_ptr<const ComputeMark> mark_;  // FollowMark's, for the next collective
};

}  // namespace

std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> inner, Ops* ops) {
  return std::make_unique<StagedCommunicator>(std::move(inner), ops, Side::kHost);
}

std::unique_ptr<Communicator> StageThroughDevice(std::unique_ptr<Communicator> inner, Ops* ops) {
  return std::make_unique<StagedCommunicator>(std::move(inner), ops, Side::kDevice);
}

}  // namespace drover::engine::parallel
