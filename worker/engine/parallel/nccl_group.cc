#include "worker/engine/parallel/nccl_group.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "worker/engine/kernels/cuda/cuda_check.h"

namespace drover::engine::parallel {
namespace {

// Short polls first (a small collective finishes in microseconds), then sleeps, so that a
// long wait does not burn the core the training thread needs.
void Backoff(int round) {
  if (round < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(round < 1024 ? 20 : 200));
  }
}

}  // namespace

Status CudaNcclStatus(ncclResult_t result, const char* call, const std::string& where) {
  if (result == ncclSuccess || result == ncclInProgress) return OkStatus();
  std::string message = where + ": " + call + ": " + ncclGetErrorString(result);
  if (result == ncclRemoteError || result == ncclSystemError) {
    return UnavailableError(std::move(message));
  }
  return InternalError(std::move(message));
}

Status CudaNcclStatus(cudaError_t error, const char* call, const std::string& where) {
  if (error == cudaSuccess) return OkStatus();
  if (cuda::IsDeviceFault(error))
    cuda::DeviceFailed((where + ": " + call).c_str(), error, __FILE__, __LINE__);
  return InternalError(where + ": " + call + ": " + cudaGetErrorName(error) + " (" +
                       cudaGetErrorString(error) + ")");
}

StatusOr<std::shared_ptr<const CudaEvent>> CudaEvent::Create(bool timing,
                                                             const std::string& where) {
  cudaEvent_t event = nullptr;
  RETURN_IF_ERROR(CudaNcclStatus(
      cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming),
      "cudaEventCreateWithFlags", where));
  return std::shared_ptr<const CudaEvent>(new CudaEvent(event));
}

CudaEvent::~CudaEvent() {
  const cudaError_t destroyed = cudaEventDestroy(event_);
  if (destroyed != cudaSuccess) spdlog::warn("cudaEventDestroy: {}", cudaGetErrorName(destroyed));
}

void NcclGroup::Log(const Status& status) {
  if (!status.ok()) spdlog::warn("{}", status.ToString());
}

NcclGroup::~NcclGroup() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  watch_.SignalAll();
  if (watchdog_.joinable()) watchdog_.join();
  MutexLock lock(&mu_);
  Log(CudaNcclStatus(cudaSetDevice(device_), "cudaSetDevice", Where("Destroy")));
  if (comm_ != nullptr && error_.ok()) {
    // Finalize flushes the communicator's work, bounded like any call; a failure aborts.
    Status finalized = Check(ncclCommFinalize(comm_), "ncclCommFinalize", Where("Destroy"));
    if (finalized.ok()) {
      finalized = Poll("Destroy", NcclClock::now() + timeout_, [] { return StatusOr<bool>(true); });
    }
    Log(finalized);
    if (comm_ != nullptr) {
      Log(CudaNcclStatus(ncclCommDestroy(comm_), "ncclCommDestroy", Where("Destroy")));
    }
  } else if (comm_ != nullptr) {
    Log(CudaNcclStatus(ncclCommAbort(comm_), "ncclCommAbort", Where("Destroy")));
  }
  in_flight_.clear();
  stalls_.clear();
  if (scalar_ != nullptr) Log(CudaNcclStatus(cudaFree(scalar_), "cudaFree", Where("Destroy")));
  if (ordered_ != nullptr) {
    Log(CudaNcclStatus(cudaEventDestroy(ordered_), "cudaEventDestroy", Where("Destroy")));
  }
  if (stream_ != nullptr) {
    Log(CudaNcclStatus(cudaStreamDestroy(stream_), "cudaStreamDestroy", Where("Destroy")));
  }
}

Status NcclGroup::Init(const ncclUniqueId& id, NcclClock::time_point deadline) {
  {
    MutexLock lock(&mu_);
    RETURN_IF_ERROR(InitLocked(id, deadline));
  }
  if (stream_ordered_) watchdog_ = std::thread([this] { Watch(); });
  return OkStatus();
}

Status NcclGroup::OrderAfterCompute(const std::string& where, cudaEvent_t event) {
  if (after_ == nullptr) return OkStatus();
  // A stream wait takes the event's state when it is enqueued, so one event may serve
  // call after call.
  RETURN_IF_ERROR(Check(cudaEventRecord(event, after_), "cudaEventRecord", where));
  return Check(cudaStreamWaitEvent(stream_, event, 0), "cudaStreamWaitEvent", where);
}

Status NcclGroup::WaitForCompute(const char* op, cudaEvent_t computed) {
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

Status NcclGroup::Run(const char* op, const Enqueue& enqueue, cudaEvent_t marked,
                      std::shared_ptr<const CudaEvent>* request_end) {
  RETURN_IF_ERROR(Advance());
  const std::string where = Where(op);
  RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice", where));
  cudaEvent_t computed = ordered_;
  if (marked != nullptr && after_ != nullptr) {
    RETURN_IF_ERROR(Check(cudaStreamWaitEvent(stream_, marked, 0), "cudaStreamWaitEvent", where));
    computed = marked;
  } else {
    RETURN_IF_ERROR(OrderAfterCompute(where, ordered_));
  }
  if (stream_ordered_) {
    ASSIGN_OR_RETURN(std::shared_ptr<const CudaEvent> started, RecordOnStream(where));
    RETURN_IF_ERROR(EnqueueNow(enqueue));
    ASSIGN_OR_RETURN(std::shared_ptr<const CudaEvent> done,
                     InFlightAfter(op, std::move(started), request_end == nullptr));
    if (request_end != nullptr) *request_end = std::move(done);
    return OkStatus();
  }
  RETURN_IF_ERROR(EnqueueNow(enqueue));
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

StatusOr<std::shared_ptr<const CudaEvent>> NcclGroup::InFlightAfter(
    const char* op, std::shared_ptr<const CudaEvent> started, bool compute_waits) {
  const std::string where = Where(op);
  const std::chrono::milliseconds allowed = NextTimeout();
  RETURN_IF_ERROR(Poll(op, NcclClock::now() + allowed, [] { return StatusOr<bool>(true); }));
  ASSIGN_OR_RETURN(std::shared_ptr<const CudaEvent> done, RecordOnStream(where));
  in_flight_.push_back(InFlight{op, std::move(started), done, allowed, NcclClock::now(), {}});
  watch_.Signal();
  if (compute_waits) RETURN_IF_ERROR(ComputeWaitsFor(where, done));
  return done;
}

Status NcclGroup::ComputeWaitsFor(const std::string& where, std::shared_ptr<const CudaEvent> done) {
  if (!error_.ok()) return error_;
  RETURN_IF_ERROR(Check(cudaSetDevice(device_), "cudaSetDevice", where));
  ASSIGN_OR_RETURN(std::shared_ptr<const CudaEvent> reached, NewEvent(/*timing=*/true, where));
  RETURN_IF_ERROR(Check(cudaEventRecord(reached->get(), after_), "cudaEventRecord", where));
  RETURN_IF_ERROR(Check(cudaStreamWaitEvent(after_, done->get(), 0), "cudaStreamWaitEvent", where));
  stalls_.push_back(Stall{std::move(reached), std::move(done)});
  watch_.Signal();
  return OkStatus();
}

Status NcclGroup::Sync() {
  for (int round = 0;; ++round) {
    RETURN_IF_ERROR(Advance());
    if (in_flight_.empty() && stalls_.empty()) return OkStatus();
    Backoff(round);
  }
}

Status NcclGroup::Poll(const char* op, NcclClock::time_point deadline,
                       const std::function<StatusOr<bool>()>& done, const char* cause) {
  if (!error_.ok()) return error_;
  const std::string where = Where(op);
  const auto started = NcclClock::now();
  for (int round = 0;; ++round) {
    ncclResult_t state = ncclSuccess;
    RETURN_IF_ERROR(AsyncError(where, &state));
    if (state == ncclSuccess) {
      StatusOr<bool> finished = done();
      if (!finished.ok()) return Break(finished.status());
      if (*finished) return OkStatus();
    }
    if (NcclClock::now() >= deadline) {
      return Break(Overdue(where, deadline - started, cause));
    }
    Backoff(round);
  }
}

Status NcclGroup::Break(Status status) {
  if (error_.ok()) error_ = std::move(status);
  if (comm_ != nullptr) {
    Log(CudaNcclStatus(ncclCommAbort(comm_), "ncclCommAbort", Where("Abort")));
    comm_ = nullptr;
  }
  in_flight_.clear();  // their events may go: a pending event is released once it passes
  stalls_.clear();
  return error_;
}

Status NcclGroup::InitLocked(const ncclUniqueId& id, NcclClock::time_point deadline) {
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

Status NcclGroup::AsyncError(const std::string& where, ncclResult_t* state) {
  Status polled =
      CudaNcclStatus(ncclCommGetAsyncError(comm_, state), "ncclCommGetAsyncError", where);
  if (polled.ok()) polled = CudaNcclStatus(*state, "asynchronous error", where);
  return polled.ok() ? polled : Break(std::move(polled));
}

Status NcclGroup::Advance() {
  if (!error_.ok()) return error_;
  RETURN_IF_ERROR(RetireStalls());
  if (in_flight_.empty()) return OkStatus();
  ncclResult_t state = ncclSuccess;
  RETURN_IF_ERROR(AsyncError(Where(in_flight_.front().op), &state));
  while (!in_flight_.empty()) {
    InFlight& head = in_flight_.front();
    const std::string where = Where(head.op);
    const cudaError_t ended = cudaEventQuery(head.done->get());
    if (ended == cudaSuccess) {
      in_flight_.pop_front();
      continue;
    }
    if (ended != cudaErrorNotReady) return Check(ended, "cudaEventQuery", where);
    const auto now = NcclClock::now();
    if (!head.began.has_value()) {
      const cudaError_t started = cudaEventQuery(head.started->get());
      if (started == cudaSuccess) {
        head.began = now;
      } else if (started != cudaErrorNotReady) {
        return Check(started, "cudaEventQuery", where);
      } else if (now - head.enqueued >= kComputeBacklogLimit) {
        return Break(Overdue(where, kComputeBacklogLimit,
                             "the kernels it follows on the compute stream did not finish"));
      }
    }
    if (head.began.has_value() && now - *head.began >= head.timeout) {
      return Break(Overdue(where, head.timeout, "a peer hangs or is slow"));
    }
    break;
  }
  return OkStatus();
}

Status NcclGroup::RetireStalls() {
  while (!stalls_.empty()) {
    const Stall& head = stalls_.front();
    const std::string where = Where("wait");
    for (const CudaEvent* event : {head.reached.get(), head.done.get()}) {
      const cudaError_t passed = cudaEventQuery(event->get());
      if (passed == cudaErrorNotReady) return OkStatus();
      RETURN_IF_ERROR(Check(passed, "cudaEventQuery", where));
    }
    float ms = 0;
    RETURN_IF_ERROR(Check(cudaEventElapsedTime(&ms, head.reached->get(), head.done->get()),
                          "cudaEventElapsedTime", where));
    // The transfer may have ended before the compute got there: no stall.
    if (ms > 0) {
      waited_.Add(std::chrono::duration_cast<NcclClock::duration>(
          std::chrono::duration<double, std::milli>(ms)));
    }
    stalls_.pop_front();
  }
  return OkStatus();
}

void NcclGroup::Watch() {
  MutexLock lock(&mu_);
  // The group's device is current per thread; a failure shows at the first query.
  Log(CudaNcclStatus(cudaSetDevice(device_), "cudaSetDevice", Where("watchdog")));
  while (!stopping_) {
    if ((in_flight_.empty() && stalls_.empty()) || !error_.ok()) {
      watch_.Wait(&mu_);
      continue;
    }
    Status advanced = Advance();
    if (!advanced.ok()) {
      spdlog::error("{}", advanced.ToString());
      continue;
    }
    watch_.WaitFor(&mu_, kWatchPeriod);
  }
}

}  // namespace drover::engine::parallel
