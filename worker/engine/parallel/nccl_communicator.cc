#include "worker/engine/parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "common/mutex.h"
#include "worker/engine/parallel/nccl_group.h"

namespace drover::engine::parallel {
namespace {

ncclDataType_t NcclType(DataType type) {
  return type == DataType::kFloat32 ? ncclFloat32 : ncclFloat64;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

// Communicator::MarkCompute's mark: an event recorded on the compute stream, destroyed with
// the mark (on whichever thread drops it last).
class NcclComputeMark final : public ComputeMark {
 public:
  // Records a new event on `compute` (device `device`); null where that fails (the caller
  // then orders at the call, as without a mark).
  static std::shared_ptr<const ComputeMark> Make(int device, cudaStream_t compute) {
    if (cudaSetDevice(device) != cudaSuccess) return nullptr;
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) return nullptr;
    if (cudaEventRecord(event, compute) != cudaSuccess) {
      NcclGroup::Log(CudaNcclStatus(cudaEventDestroy(event), "cudaEventDestroy", "MarkCompute"));
      return nullptr;
    }
    return std::make_shared<NcclComputeMark>(event);
  }
  explicit NcclComputeMark(cudaEvent_t event) : event_(event) {}
  ~NcclComputeMark() override {
    NcclGroup::Log(CudaNcclStatus(cudaEventDestroy(event_), "cudaEventDestroy", "MarkCompute"));
  }
  cudaEvent_t event() const { return event_; }

 private:
  const cudaEvent_t event_;
};

// An Isend or Irecv. Completed at the call's end: an event recorded on the compute stream
// before the transfer (`computed`) and one on the group's stream after it (`transferred`),
// which Wait polls. Stream-ordered: `transferred` only, which Wait orders the compute stream
// after; the watchdog holds the transfer's deadline from its call on.
//
// As a collective's (NcclGroup::Run), a request's deadline and its wait_seconds start once
// the compute it follows has finished: a pipeline stage waits for its neighbour's
// activations right after enqueueing its own kernels, and the GPU's backlog of them is not
// time spent waiting for the neighbour (pp_wait_ms, busy_ms), nor a sign that it hangs.
class NcclRequest final : public Request {
 public:
  // Either event may be null: `computed` where the group follows no compute stream or is
  // stream-ordered, both for an empty message (nothing was enqueued).
  NcclRequest(std::shared_ptr<NcclGroup> group, const char* op,
              std::shared_ptr<const CudaEvent> computed,
              std::shared_ptr<const CudaEvent> transferred, std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        op_(op),
        computed_(std::move(computed)),
        transferred_(std::move(transferred)),
        timeout_(timeout) {}

  ~NcclRequest() override {
    if (!waited_) (void)Wait();
  }

  Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    MutexLock lock(group_->mu());
    const std::string where = group_->Where(op_);
    if (group_->stream_ordered()) {
      status_ =
          transferred_ == nullptr ? group_->error() : group_->ComputeWaitsFor(where, transferred_);
      return status_;
    }
    if (computed_ != nullptr) {
      status_ = group_->WaitForCompute(op_, computed_->get());
      if (!status_.ok()) return status_;
    }
    const auto ready = NcclClock::now();
    status_ = group_->Poll(op_, ready + timeout_, [&]() -> StatusOr<bool> {
      if (transferred_ == nullptr) return true;
      const cudaError_t state = cudaEventQuery(transferred_->get());
      if (state == cudaErrorNotReady) return false;
      DROVER_CUDA_NCCL(where, state);
      return true;
    });
    group_->AddWait(NcclClock::now() - ready);
    return status_;
  }

 private:
  const std::shared_ptr<NcclGroup> group_;
  const char* const op_;
  const std::shared_ptr<const CudaEvent> computed_;     // null if none
  const std::shared_ptr<const CudaEvent> transferred_;  // null if none
  const std::chrono::milliseconds timeout_;
  bool waited_ = false;
  Status status_;
};

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<NcclGroup> group) : group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return group_->name(); }
  std::chrono::milliseconds timeout() const override { return group_->timeout(); }
  double wait_seconds() const override { return group_->wait_seconds(); }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) override {
    MutexLock lock(group_->mu());
    if (count == 0) {
      next_mark_ = nullptr;  // FollowMark's mark was for this call
      return group_->error();
    }
    const std::string where = group_->Where("AllReduce");
    return Run("AllReduce", [&](ncclComm_t comm, cudaStream_t stream) -> Status {
      DROVER_CUDA_NCCL(where,
                       ncclAllReduce(data, data, count, NcclType(type), NcclOp(op), comm, stream));
      return OkStatus();
    });
  }

  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp op) override {
    DROVER_CHECK_MSG(counts.size() == static_cast<size_t>(size()), "one count per rank");
    MutexLock lock(group_->mu());
    const std::string where = group_->Where("ReduceScatter");
    auto* bytes = static_cast<std::byte*>(data);
    const size_t element = SizeOf(type);
    return Run("ReduceScatter", [&](ncclComm_t comm, cudaStream_t stream) -> Status {
      if (AllEqual(counts)) {
        if (counts[0] == 0) return OkStatus();
        // In place: this rank's chunk of the send buffer is the receive buffer.
        DROVER_CUDA_NCCL(where,
                         ncclReduceScatter(data, bytes + rank() * counts[0] * element, counts[0],
                                           NcclType(type), NcclOp(op), comm, stream));
        return OkStatus();
      }
      return PerChunk(where, bytes, counts, element, [&](int root, std::byte* chunk, size_t count) {
        return ncclReduce(chunk, chunk, count, NcclType(type), NcclOp(op), root, comm, stream);
      });
    });
  }

  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    DROVER_CHECK_MSG(counts.size() == static_cast<size_t>(size()), "one count per rank");
    MutexLock lock(group_->mu());
    const std::string where = group_->Where("AllGather");
    auto* bytes = static_cast<std::byte*>(data);
    const size_t element = SizeOf(type);
    return Run("AllGather", [&](ncclComm_t comm, cudaStream_t stream) -> Status {
      if (AllEqual(counts)) {
        if (counts[0] == 0) return OkStatus();
        DROVER_CUDA_NCCL(where, ncclAllGather(bytes + rank() * counts[0] * element, data, counts[0],
                                              NcclType(type), comm, stream));
        return OkStatus();
      }
      return PerChunk(where, bytes, counts, element, [&](int root, std::byte* chunk, size_t count) {
        return ncclBroadcast(chunk, chunk, count, NcclType(type), root, comm, stream);
      });
    });
  }

  Status Broadcast(void* data, size_t count, DataType type, int root) override {
    DROVER_CHECK_MSG(root >= 0 && root < size(), "broadcast root out of range");
    MutexLock lock(group_->mu());
    if (count == 0) {
      next_mark_ = nullptr;  // FollowMark's mark was for this call
      return group_->error();
    }
    const std::string where = group_->Where("Broadcast");
    return Run("Broadcast", [&](ncclComm_t comm, cudaStream_t stream) -> Status {
      DROVER_CUDA_NCCL(where, ncclBroadcast(data, data, count, NcclType(type), root, comm, stream));
      return OkStatus();
    });
  }

  std::shared_ptr<const ComputeMark> MarkCompute() override {
    // Any thread: only the group's constants are read.
    if (!group_->ordered()) return nullptr;
    return NcclComputeMark::Make(group_->device(), group_->compute_stream());
  }
  void FollowMark(std::shared_ptr<const ComputeMark> mark) override {
    next_mark_ = std::move(mark);
  }

  StatusOr<std::unique_ptr<Request>> Isend(const void* data, size_t bytes, int peer,
                                           uint64_t) override {
    return Post("Isend", bytes, peer, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclSend(data, bytes, ncclUint8, peer, comm, stream);
    });
  }

  StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int peer, uint64_t) override {
    return Post("Irecv", bytes, peer, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclRecv(data, bytes, ncclUint8, peer, comm, stream);
    });
  }

  // Complete at its return in stream order too: the ranks' meeting is the host's business.
  Status Barrier() override {
    MutexLock lock(group_->mu());
    const std::string where = group_->Where("Barrier");
    RETURN_IF_ERROR(Run("Barrier", [&](ncclComm_t comm, cudaStream_t stream) -> Status {
      DROVER_CUDA_NCCL(where, ncclAllReduce(group_->scalar(), group_->scalar(), 1, ncclFloat32,
                                            ncclSum, comm, stream));
      return OkStatus();
    }));
    return group_->Sync();
  }

  Status Sync() override {
    MutexLock lock(group_->mu());
    return group_->Sync();
  }

 private:
  // A collective through the group (NcclGroup::Run), after FollowMark's mark where one was
  // given: taken, and held until the call returns. The caller holds the group's lock.
  Status Run(const char* op, const NcclGroup::Enqueue& enqueue) {
    group_->mu()->AssertHeld();
    const std::shared_ptr<const ComputeMark> mark = std::move(next_mark_);
    next_mark_ = nullptr;
    const auto* ours = dynamic_cast<const NcclComputeMark*>(mark.get());
    return group_->Run(op, enqueue, ours != nullptr ? ours->event() : nullptr);
  }

  static bool AllEqual(std::span<const size_t> counts) {
    return std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
  }

  // One rooted collective per non-empty chunk (root = owner), fused in one group.
  Status PerChunk(const std::string& where, std::byte* data, std::span<const size_t> counts,
                  size_t element,
                  const std::function<ncclResult_t(int, std::byte*, size_t)>& call) {
    DROVER_CUDA_NCCL(where, ncclGroupStart());
    Status enqueued;
    size_t offset = 0;
    for (int root = 0; root < size() && enqueued.ok(); ++root) {
      if (counts[root] > 0) {
        enqueued = CudaNcclStatus(call(root, data + offset * element, counts[root]),
                                  "rooted collective", where);
      }
      offset += counts[root];
    }
    Status ended = CudaNcclStatus(ncclGroupEnd(), "ncclGroupEnd", where);
    return enqueued.ok() ? ended : enqueued;
  }

  // One send or receive as an NCCL group of its own.
  static Status Grouped(const std::string& where, const char* op,
                        const std::function<ncclResult_t()>& call) {
    DROVER_CUDA_NCCL(where, ncclGroupStart());
    Status enqueued = CudaNcclStatus(call(), op, where);
    Status ended = CudaNcclStatus(ncclGroupEnd(), "ncclGroupEnd", where);
    return enqueued.ok() ? ended : enqueued;
  }

  // Enqueues one send or receive in its own group, after the compute enqueued so far, and
  // records the request's events around it (stream-ordered: the group's Run hands it to the
  // watchdog, and the request's Wait orders the compute after it).
  StatusOr<std::unique_ptr<Request>> Post(
      const char* op, size_t bytes, int peer,
      const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call) {
    DROVER_CHECK_MSG(peer >= 0 && peer < size() && peer != rank(), "peer out of range");
    MutexLock lock(group_->mu());
    RETURN_IF_ERROR(group_->error());
    const std::string where = group_->Where(op);
    const NcclGroup::Enqueue enqueue = [&](ncclComm_t comm, cudaStream_t stream) {
      return Grouped(where, op, [&] { return call(comm, stream); });
    };
    if (bytes == 0) {
      return std::unique_ptr<Request>(
          new NcclRequest(group_, op, nullptr, nullptr, group_->timeout()));
    }
    if (group_->stream_ordered()) {
      std::shared_ptr<const CudaEvent> transferred;
      RETURN_IF_ERROR(group_->Run(op, enqueue, /*marked=*/nullptr, &transferred));
      return std::unique_ptr<Request>(
          new NcclRequest(group_, op, nullptr, std::move(transferred), group_->timeout()));
    }
    const auto timeout = group_->NextTimeout();
    RETURN_IF_ERROR(group_->Check(cudaSetDevice(group_->device()), "cudaSetDevice", where));
    std::shared_ptr<const CudaEvent> computed, transferred;
    ASSIGN_OR_RETURN(transferred, group_->NewEvent(/*timing=*/false, where));
    if (group_->ordered()) {
      ASSIGN_OR_RETURN(computed, group_->NewEvent(/*timing=*/false, where));
      RETURN_IF_ERROR(group_->OrderAfterCompute(where, computed->get()));
    }
    RETURN_IF_ERROR(group_->EnqueueNow(enqueue));
    // The event may be recorded only once NCCL has finished enqueueing.
    RETURN_IF_ERROR(
        group_->Poll(op, NcclClock::now() + timeout, [] { return StatusOr<bool>(true); }));
    RETURN_IF_ERROR(group_->Check(cudaEventRecord(transferred->get(), group_->stream()),
                                  "cudaEventRecord", where));
    return std::unique_ptr<Request>(
        new NcclRequest(group_, op, std::move(computed), std::move(transferred), timeout));
  }

  const std::shared_ptr<NcclGroup> group_;
  std::shared_ptr<const ComputeMark> next_mark_;  // FollowMark's, for the next collective
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> ConnectNcclGroup(
    KvStore* store, const std::string& group_name, int rank, int size, int device,
    cudaStream_t after, const CommOptions& options, std::chrono::milliseconds connect_timeout) {
  DROVER_CHECK_MSG(size >= 1 && rank >= 0 && rank < size, "rank out of range");
  const auto deadline = NcclClock::now() + connect_timeout;
  auto group = std::make_shared<NcclGroup>(group_name, rank, size, device, after, options.timeout,
                                           connect_timeout, options.stream_ordered);
  const std::string where = group->Where("Connect");

  ncclUniqueId id;
  PrefixKvStore group_store(store, group_name + "/nccl");
  if (rank == 0) {
    DROVER_CUDA_NCCL(where, ncclGetUniqueId(&id));
    if (size > 1) {
      RETURN_IF_ERROR(group_store.Set("unique_id", std::string(id.internal, sizeof(id.internal)))
                          .WithContext(where));
    }
  } else {
    StatusOr<std::string> bytes = group_store.Get("unique_id", connect_timeout);
    if (!bytes.ok()) return bytes.status().WithContext(where);
    if (bytes->size() != sizeof(id.internal)) {
      return InternalError(where + ": the unique id in the store has " +
                           std::to_string(bytes->size()) + " bytes, not " +
                           std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }
  RETURN_IF_ERROR(group->Init(id, deadline));
  return std::unique_ptr<Communicator>(new NcclCommunicator(std::move(group)));
}

}  // namespace drover::engine::parallel
