#include "worker/engine/parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "worker/engine/kernels/cuda/cuda_check.h"

namespace drover::engine::parallel {
namespace {

using NcclClock = std::chrono::steady_clock;

// The one translation of CUDA and NCCL results into a Status: "<where>: <call>: <error>".
// ncclInProgress is not an error: a nonblocking communicator returns it while it works,
// and the caller polls (NcclGroup::Poll). ncclRemoteError and ncclSystemError are how a
// dead peer or a broken network shows: Unavailable. Everything else is Internal.
Status CudaNcclStatus(ncclResult_t result, const char* call, const std::string& where) {
  if (result == ncclSuccess || result == ncclInProgress) return OkStatus();
  std::string message = where + ": " + call + ": " + ncclGetErrorString(result);
  if (result == ncclRemoteError || result == ncclSystemError) {
    return UnavailableError(std::move(message));
  }
  return InternalError(std::move(message));
}

// A GPU that failed (an uncorrectable ECC error seen while polling a collective's stream)
// stops the process as it does in the kernel table: its slot, not the job, is at fault.
Status CudaNcclStatus(cudaError_t error, const char* call, const std::string& where) {
  if (error == cudaSuccess) return OkStatus();
  if (cuda::IsDeviceFault(error))
    cuda::DeviceFailed((where + ": " + call).c_str(), error, __FILE__, __LINE__);
  return InternalError(where + ": " + call + ": " + cudaGetErrorName(error) + " (" +
                       cudaGetErrorString(error) + ")");
}

// Returns from the enclosing function (Status or StatusOr) when a CUDA or NCCL call fails.
#define DROVER_CUDA_NCCL(where, call) RETURN_IF_ERROR(CudaNcclStatus((call), #call, (where)))

ncclDataType_t NcclType(DataType type) {
  return type == DataType::kFloat32 ? ncclFloat32 : ncclFloat64;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

// Short polls first (a small collective finishes in microseconds), then sleeps, so that a
// long wait does not burn the core the training thread needs.
void Backoff(int round) {
  if (round < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(round < 1024 ? 20 : 200));
  }
}

// The state a group shares between its communicator and its requests.
class NcclGroup {
 public:
  // `first_timeout` bounds the group's first collective and first send or receive instead
  // of `timeout`: NCCL connects lazily, at a transfer's first use of a peer, which across
  // nodes can take seconds on its own.
  NcclGroup(std::string name, int rank, int size, int device, cudaStream_t after,
            std::chrono::milliseconds timeout, std::chrono::milliseconds first_timeout)
      : name_(std::move(name)),
        rank_(rank),
        size_(size),
        device_(device),
        after_(after),
        timeout_(timeout),
        first_timeout_(std::max(timeout, first_timeout)) {}

  ~NcclGroup() {
    Log(CudaNcclStatus(cudaSetDevice(device_), "cudaSetDevice", Where("Destroy")));
    if (comm_ != nullptr && error_.ok()) {
      // Finalize flushes the communicator's work, bounded like any call; a failure aborts.
      Status finalized = Check(ncclCommFinalize(comm_), "ncclCommFinalize", Where("Destroy"));
      if (finalized.ok()) {
        finalized =
            Poll("Destroy", NcclClock::now() + timeout_, [] { return StatusOr<bool>(true); });
      }
      Log(finalized);
      if (comm_ != nullptr) {
        Log(CudaNcclStatus(ncclCommDestroy(comm_), "ncclCommDestroy", Where("Destroy")));
      }
    } else if (comm_ != nullptr) {
      Log(CudaNcclStatus(ncclCommAbort(comm_), "ncclCommAbort", Where("Destroy")));
    }
    if (scalar_ != nullptr) Log(CudaNcclStatus(cudaFree(scalar_), "cudaFree", Where("Destroy")));
    if (ordered_ != nullptr) {
      Log(CudaNcclStatus(cudaEventDestroy(ordered_), "cudaEventDestroy", Where("Destroy")));
    }
    if (stream_ != nullptr) {
      Log(CudaNcclStatus(cudaStreamDestroy(stream_), "cudaStreamDestroy", Where("Destroy")));
    }
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t comm() const { return comm_; }
  float* scalar() const { return scalar_; }
  const Status& error() const { return error_; }

  // "nccl group "tp" (rank 1 of 4) AllReduce"
  std::string Where(const char* op) const {
    return "nccl group \"" + name_ + "\" (rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + ") " + op;
  }

  // Creates the stream, the ordering event, the communicator (nonblocking) and the
  // barrier's device scalar.
  Status Init(const ncclUniqueId& id, NcclClock::time_point deadline) {
    const std::string where = Where("Connect");
    DROVER_CUDA_NCCL(where, cudaSetDevice(device_));
    DROVER_CUDA_NCCL(where, cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DROVER_CUDA_NCCL(where, cudaEventCreateWithFlags(&ordered_, cudaEventDisableTiming));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = name_.c_str();
    ncclComm_t comm = nullptr;
    Status started = CudaNcclStatus(ncclCommInitRankConfig(&comm, size_, id, rank_, &config),
                                    "ncclCommInitRankConfig", where);
    comm_ = comm;
    if (!started.ok()) return Break(std::move(started));
    RETURN_IF_ERROR(Poll("Connect", deadline, [] { return StatusOr<bool>(true); }));
    void* scalar = nullptr;
    RETURN_IF_ERROR(Check(cudaMalloc(&scalar, sizeof(float)), "cudaMalloc", where));
    scalar_ = static_cast<float*>(scalar);
    return Check(cudaMemsetAsync(scalar_, 0, sizeof(float), stream_), "cudaMemsetAsync", where);
  }

  // Whether calls follow a compute stream (OrderAfterCompute has work to order after).
  bool ordered() const { return after_ != nullptr; }
  cudaStream_t compute_stream() const { return after_; }

  // Makes the group's stream wait for the work enqueued on `after` so far, recording
  // `event` there (the group's own for a call, which it waits on before it returns; a
  // request's, which its Wait finds later).
  Status OrderAfterCompute(const std::string& where, cudaEvent_t event) {
    if (after_ == nullptr) return OkStatus();
    // A stream wait takes the event's state when it is enqueued, so one event may serve
    // call after call.
    RETURN_IF_ERROR(Check(cudaEventRecord(event, after_), "cudaEventRecord", where));
    return Check(cudaStreamWaitEvent(stream_, event, 0), "cudaStreamWaitEvent", where);
  }

  // Polls until `computed` (OrderAfterCompute's event) has passed: the compute a call
  // follows. That backlog has a bound of its own (kComputeBacklogLimit), so a kernel that
  // never ends still fails the call rather than hang it.
  Status WaitForCompute(const char* op, cudaEvent_t computed) {
    const std::string where = Where(op);
    return Poll(
        op, NcclClock::now() + kComputeBacklogLimit,
        [&]() -> StatusOr<bool> {
          const cudaError_t state = cudaEventQuery(computed);
          if (state == cudaErrorNotReady) return false;
          DROVER_CUDA_NCCL(where, state);
          return true;
        },
        "the kernels it follows on the compute stream did not finish");
  }

  // Runs `enqueue` (NCCL calls on the stream) after the compute stream's work, then polls
  // until the stream has drained: after the work enqueued so far, or where `marked` is
  // given (an event recorded on the compute stream earlier: Communicator::MarkCompute),
  // after the work enqueued before it.
  //
  // The call's deadline and its wait_seconds start once that compute has finished, not at
  // the call: the GPU runs behind the host (by up to the rest of a backward pass when the
  // call reduces an early gradient bucket), and a backlog of our own kernels is neither a
  // sign of a hung peer nor time spent waiting for one.
  Status Run(const char* op, const std::function<Status()>& enqueue, cudaEvent_t marked = nullptr) {
    if (!error_.ok()) return error_;
    const std::string where = Where(op);
    RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice", where));
    cudaEvent_t computed = ordered_;
    if (marked != nullptr && after_ != nullptr) {
      RETURN_IF_ERROR(Check(cudaStreamWaitEvent(stream_, marked, 0), "cudaStreamWaitEvent", where));
      computed = marked;
    } else {
      RETURN_IF_ERROR(OrderAfterCompute(where, ordered_));
    }
    // enqueue's own failures (bad arguments, a peer that failed at once) break the group too.
    Status enqueued = enqueue();
    if (!enqueued.ok()) return Break(std::move(enqueued));
    if (after_ != nullptr) RETURN_IF_ERROR(WaitForCompute(op, computed));
    // From here on the rank waits for its peers and the transfer (wait_seconds).
    const auto ready = NcclClock::now();
    Status drained = Poll(op, ready + NextTimeout(), [&]() -> StatusOr<bool> {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaErrorNotReady) return false;
      DROVER_CUDA_NCCL(where, state);
      return true;
    });
    waited_.Add(NcclClock::now() - ready);
    return drained;
  }

  // Communicator::wait_seconds: Run's transfers and the requests' waits.
  double wait_seconds() const { return waited_.seconds(); }
  void AddWait(NcclClock::duration waited) { waited_.Add(waited); }

  // How long the next transfer may take: first_timeout_ for the group's first one.
  std::chrono::milliseconds NextTimeout() {
    const auto allowed = used_ ? timeout_ : first_timeout_;
    used_ = true;
    return allowed;
  }

  // Polls until NCCL has finished enqueueing (it is nonblocking) and then `done` says
  // true; fails (and aborts the communicator) on NCCL's asynchronous error, on an error of
  // `done`, or at `deadline`.
  Status Poll(const char* op, NcclClock::time_point deadline,
              const std::function<StatusOr<bool>()>& done,
              const char* cause = "a peer hangs or is slow") {
    if (!error_.ok()) return error_;
    const std::string where = Where(op);
    const auto started = NcclClock::now();
    for (int round = 0;; ++round) {
      ncclResult_t state = ncclSuccess;
      Status polled =
          CudaNcclStatus(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError", where);
      if (polled.ok()) polled = CudaNcclStatus(state, "asynchronous error", where);
      if (!polled.ok()) return Break(std::move(polled));
      if (state == ncclSuccess) {
        StatusOr<bool> finished = done();
        if (!finished.ok()) return Break(finished.status());
        if (*finished) return OkStatus();
      }
      if (NcclClock::now() >= deadline) {
        const auto allowed = std::chrono::ceil<std::chrono::milliseconds>(deadline - started);
        return Break(DeadlineExceededError(where + ": not complete within " +
                                           std::to_string(allowed.count()) + " ms (" + cause +
                                           "); communicator aborted"));
      }
      Backoff(round);
    }
  }

  // The call's Status (CudaNcclStatus); a failure breaks the group.
  template <typename Result>
  Status Check(Result result, const char* call, const std::string& where) {
    Status status = CudaNcclStatus(result, call, where);
    return status.ok() ? status : Break(std::move(status));
  }

  // Keeps the first error and aborts the communicator: after an error NCCL's state is
  // unknown and only ncclCommAbort frees a rank stuck in a collective. Returns the first
  // error.
  Status Break(Status status) {
    if (error_.ok()) error_ = std::move(status);
    if (comm_ != nullptr) {
      Log(CudaNcclStatus(ncclCommAbort(comm_), "ncclCommAbort", Where("Abort")));
      comm_ = nullptr;
    }
    return error_;
  }

  // Logs what a destructor cannot return.
  static void Log(const Status& status) {
    if (!status.ok()) spdlog::warn("{}", status.ToString());
  }

 private:
  const std::string name_;
  const int rank_;
  const int size_;
  const int device_;
  const cudaStream_t after_;  // the compute stream, or null
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds first_timeout_;
  // How long a call waits for the compute it is ordered after (Run).
  static constexpr std::chrono::minutes kComputeBacklogLimit{5};
  bool used_ = false;              // a transfer has been enqueued (NextTimeout)
  cudaStream_t stream_ = nullptr;  // every NCCL call of the group; owned
  cudaEvent_t ordered_ = nullptr;  // OrderAfterCompute's
  ncclComm_t comm_ = nullptr;      // null before Init and after an abort
  float* scalar_ = nullptr;        // device memory: the barrier's all-reduce operand
  Status error_;
  WaitTally waited_;
};

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

// An Isend or Irecv: an event recorded on the compute stream before the transfer
// (`computed`) and one on the group's stream after it (`transferred`).
//
// As a collective's (NcclGroup::Run), a request's deadline and its wait_seconds start once
// the compute it follows has finished: a pipeline stage waits for its neighbour's
// activations right after enqueueing its own kernels, and the GPU's backlog of them is not
// time spent waiting for the neighbour (pp_wait_ms, busy_ms), nor a sign that it hangs.
class NcclRequest final : public Request {
 public:
  // Either event may be null: `computed` where the group follows no compute stream, both
  // for an empty message (nothing was enqueued).
  NcclRequest(std::shared_ptr<NcclGroup> group, const char* op, cudaEvent_t computed,
              cudaEvent_t transferred, std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        op_(op),
        computed_(computed),
        transferred_(transferred),
        timeout_(timeout) {}

  ~NcclRequest() override {
    if (!waited_) (void)Wait();
    for (cudaEvent_t event : {computed_, transferred_}) {
      if (event == nullptr) continue;
      Status destroyed =
          group_->Check(cudaEventDestroy(event), "cudaEventDestroy", group_->Where(op_));
      NcclGroup::Log(destroyed);
    }
  }

  Status Wait() override {
    if (waited_) return status_;
    waited_ = true;
    if (computed_ != nullptr) {
      status_ = group_->WaitForCompute(op_, computed_);
      if (!status_.ok()) return status_;
    }
    const std::string where = group_->Where(op_);
    const auto ready = NcclClock::now();
    status_ = group_->Poll(op_, ready + timeout_, [&]() -> StatusOr<bool> {
      if (transferred_ == nullptr) return true;
      const cudaError_t state = cudaEventQuery(transferred_);
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
  const cudaEvent_t computed_;     // owned; null if none
  const cudaEvent_t transferred_;  // owned; null if none
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
    if (count == 0) {
      next_mark_ = nullptr;  // FollowMark's mark was for this call
      return group_->error();
    }
    const std::string where = group_->Where("AllReduce");
    return Run("AllReduce", [&]() -> Status {
      DROVER_CUDA_NCCL(where, ncclAllReduce(data, data, count, NcclType(type), NcclOp(op),
                                            group_->comm(), group_->stream()));
      return OkStatus();
    });
  }

  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp op) override {
    DROVER_CHECK_MSG(counts.size() == static_cast<size_t>(size()), "one count per rank");
    const std::string where = group_->Where("ReduceScatter");
    auto* bytes = static_cast<std::byte*>(data);
    const size_t element = SizeOf(type);
    return Run("ReduceScatter", [&]() -> Status {
      if (AllEqual(counts)) {
        if (counts[0] == 0) return OkStatus();
        // In place: this rank's chunk of the send buffer is the receive buffer.
        DROVER_CUDA_NCCL(
            where, ncclReduceScatter(data, bytes + rank() * counts[0] * element, counts[0],
                                     NcclType(type), NcclOp(op), group_->comm(), group_->stream()));
        return OkStatus();
      }
      return PerChunk(where, bytes, counts, element, [&](int root, std::byte* chunk, size_t count) {
        return ncclReduce(chunk, chunk, count, NcclType(type), NcclOp(op), root, group_->comm(),
                          group_->stream());
      });
    });
  }

  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    DROVER_CHECK_MSG(counts.size() == static_cast<size_t>(size()), "one count per rank");
    const std::string where = group_->Where("AllGather");
    auto* bytes = static_cast<std::byte*>(data);
    const size_t element = SizeOf(type);
    return Run("AllGather", [&]() -> Status {
      if (AllEqual(counts)) {
        if (counts[0] == 0) return OkStatus();
        DROVER_CUDA_NCCL(where, ncclAllGather(bytes + rank() * counts[0] * element, data, counts[0],
                                              NcclType(type), group_->comm(), group_->stream()));
        return OkStatus();
      }
      return PerChunk(where, bytes, counts, element, [&](int root, std::byte* chunk, size_t count) {
        return ncclBroadcast(chunk, chunk, count, NcclType(type), root, group_->comm(),
                             group_->stream());
      });
    });
  }

  Status Broadcast(void* data, size_t count, DataType type, int root) override {
    DROVER_CHECK_MSG(root >= 0 && root < size(), "broadcast root out of range");
    if (count == 0) {
      next_mark_ = nullptr;  // FollowMark's mark was for this call
      return group_->error();
    }
    const std::string where = group_->Where("Broadcast");
    return Run("Broadcast", [&]() -> Status {
      DROVER_CUDA_NCCL(where, ncclBroadcast(data, data, count, NcclType(type), root, group_->comm(),
                                            group_->stream()));
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
    return Post("Isend", bytes, peer, [&] {
      return ncclSend(data, bytes, ncclUint8, peer, group_->comm(), group_->stream());
    });
  }

  StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int peer, uint64_t) override {
    return Post("Irecv", bytes, peer, [&] {
      return ncclRecv(data, bytes, ncclUint8, peer, group_->comm(), group_->stream());
    });
  }

  Status Barrier() override {
    const std::string where = group_->Where("Barrier");
    return Run("Barrier", [&]() -> Status {
      DROVER_CUDA_NCCL(where, ncclAllReduce(group_->scalar(), group_->scalar(), 1, ncclFloat32,
                                            ncclSum, group_->comm(), group_->stream()));
      return OkStatus();
    });
  }

 private:
  // A collective through the group (NcclGroup::Run), after FollowMark's mark where one was
  // given: taken, and held until the call returns.
  Status Run(const char* op, const std::function<Status()>& enqueue) {
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

  // Enqueues one send or receive in its own group, after the compute enqueued so far, and
  // records the request's events around it.
  StatusOr<std::unique_ptr<Request>> Post(const char* op, size_t bytes, int peer,
                                          const std::function<ncclResult_t()>& call) {
    DROVER_CHECK_MSG(peer >= 0 && peer < size() && peer != rank(), "peer out of range");
    if (!group_->error().ok()) return group_->error();
    const auto timeout = group_->NextTimeout();
    const std::string where = group_->Where(op);
    if (bytes == 0) {
      return std::unique_ptr<Request>(new NcclRequest(group_, op, nullptr, nullptr, timeout));
    }
    RETURN_IF_ERROR(group_->Check(cudaSetDevice(group_->device()), "cudaSetDevice", where));
    cudaEvent_t computed = nullptr, transferred = nullptr;
    Status created = CreateEvent(&transferred, where);
    if (created.ok() && group_->ordered()) created = CreateEvent(&computed, where);
    // The request owns the events from here on, so every path below releases them (after a
    // failure the group is broken, and the request's Wait returns at once).
    auto request = std::make_unique<NcclRequest>(group_, op, computed, transferred, timeout);
    RETURN_IF_ERROR(created);
    if (computed != nullptr) RETURN_IF_ERROR(group_->OrderAfterCompute(where, computed));
    Status enqueued = CudaNcclStatus(ncclGroupStart(), "ncclGroupStart", where);
    if (enqueued.ok()) enqueued = CudaNcclStatus(call(), op, where);
    Status ended = CudaNcclStatus(ncclGroupEnd(), "ncclGroupEnd", where);
    if (enqueued.ok()) enqueued = ended;
    if (!enqueued.ok()) return group_->Break(std::move(enqueued));
    // The event may be recorded only once NCCL has finished enqueueing.
    RETURN_IF_ERROR(
        group_->Poll(op, NcclClock::now() + timeout, [] { return StatusOr<bool>(true); }));
    RETURN_IF_ERROR(
        group_->Check(cudaEventRecord(transferred, group_->stream()), "cudaEventRecord", where));
    return std::unique_ptr<Request>(std::move(request));
  }

  // Sets *event only when the event was made: a failed call leaves its output undefined.
  Status CreateEvent(cudaEvent_t* event, const std::string& where) {
    cudaEvent_t made = nullptr;
    Status status = group_->Check(cudaEventCreateWithFlags(&made, cudaEventDisableTiming),
                                  "cudaEventCreateWithFlags", where);
    if (status.ok()) *event = made;
    return status;
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
                                           connect_timeout);
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
