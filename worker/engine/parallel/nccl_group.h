// The state of one NCCL group that its communicator (nccl_communicator.cc), its requests
// and its watchdog share: the communicator, its stream and events, the deadlines, and the
// transfers a stream-ordered group has in flight. Built into the CUDA plugin only, with
// nccl_communicator.cc, whose header (nccl_communicator.h) states the behaviour.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"
#include "worker/engine/parallel/communicator.h"

namespace drover::engine::parallel {

using NcclClock = std::chrono::steady_clock;

// The one translation of CUDA and NCCL results into a Status: "<where>: <call>: <error>".
// ncclInProgress is not an error: a nonblocking communicator returns it while it works,
// and the caller polls (NcclGroup::Poll). ncclRemoteError and ncclSystemError are how a
// dead peer or a broken network shows: Unavailable. Everything else is Internal.
Status CudaNcclStatus(ncclResult_t result, const char* call, const std::string& where);
// A GPU that failed (an uncorrectable ECC error seen while polling a collective's stream)
// stops the process as it does in the kernel table: its slot, not the job, is at fault.
Status CudaNcclStatus(cudaError_t error, const char* call, const std::string& where);

// Returns from the enclosing function (Status or StatusOr) when a CUDA or NCCL call fails.
#define DROVER_CUDA_NCCL(where, call) RETURN_IF_ERROR(CudaNcclStatus((call), #call, (where)))

// A CUDA event, destroyed with its last owner (a stream-ordered call's, which the group's
// watchdog and the call's request may both hold). `timing`: cudaEventElapsedTime may
// measure between two such events.
class CudaEvent {
 public:
  static StatusOr<std::shared_ptr<const CudaEvent>> Create(bool timing, const std::string& where);
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  explicit CudaEvent(cudaEvent_t event) : event_(event) {}
  const cudaEvent_t event_;
};

// The state a group shares between its communicator and its requests, and with its watchdog
// when stream-ordered.
//
// Locking: mu_ is held by whoever uses the group (a call of the communicator, a request's
// Wait, the watchdog's rounds), so that the watchdog's abort never meets a call that is
// enqueueing. The communicator is used by one thread at a time (communicator.h), so the lock
// is contended only by the watchdog, which holds it for a few event queries at a time.
class NcclGroup {
 public:
  // `first_timeout` bounds the group's first collective and first send or receive instead
  // of `timeout`: NCCL connects lazily, at a transfer's first use of a peer, which across
  // nodes can take seconds on its own. `stream_ordered` (CommOptions) takes effect only
  // with a compute stream (`after`) to order against.
  NcclGroup(std::string name, int rank, int size, int device, cudaStream_t after,
            std::chrono::milliseconds timeout, std::chrono::milliseconds first_timeout,
            bool stream_ordered)
      : name_(std::move(name)),
        rank_(rank),
        size_(size),
        device_(device),
        after_(after),
        timeout_(timeout),
        first_timeout_(std::max(timeout, first_timeout)),
        stream_ordered_(stream_ordered && after != nullptr) {}

  ~NcclGroup();

  // Held by every user of the group (see the class comment).
  Mutex* mu() RETURN_CAPABILITY(mu_) { return &mu_; }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  const std::string& name() const { return name_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  bool stream_ordered() const { return stream_ordered_; }
  cudaStream_t stream() const { return stream_; }
  float* scalar() const { return scalar_; }
  const Status& error() const REQUIRES(mu_) { return error_; }

  // "nccl group "tp" (rank 1 of 4) AllReduce"
  std::string Where(const char* op) const {
    return "nccl group \"" + name_ + "\" (rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + ") " + op;
  }

  // Creates the stream, the ordering event, the communicator (nonblocking) and the
  // barrier's device scalar; then, for a stream-ordered group, starts the watchdog.
  Status Init(const ncclUniqueId& id, NcclClock::time_point deadline) EXCLUDES(mu_);

  // Whether calls follow a compute stream (OrderAfterCompute has work to order after).
  bool ordered() const { return after_ != nullptr; }
  cudaStream_t compute_stream() const { return after_; }

  // Makes the group's stream wait for the work enqueued on `after` so far, recording
  // `event` there (the group's own for a call, which it waits on before it returns; a
  // request's, which its Wait finds later).
  Status OrderAfterCompute(const std::string& where, cudaEvent_t event) REQUIRES(mu_);

  // Polls until `computed` (OrderAfterCompute's event) has passed: the compute a call
  // follows. That backlog has a bound of its own (kComputeBacklogLimit), so a kernel that
  // never ends still fails the call rather than hang it.
  Status WaitForCompute(const char* op, cudaEvent_t computed) REQUIRES(mu_);

  // NCCL calls on the group's stream (an Enqueue's).
  using Enqueue = std::function<Status(ncclComm_t, cudaStream_t)>;

  // Runs `enqueue` after the compute stream's work: after the work enqueued so far, or where
  // `marked` is given (an event recorded on the compute stream earlier:
  // Communicator::MarkCompute), after the work enqueued before it. Then polls until the
  // stream has drained, or, stream-ordered, hands the transfer to the watchdog (InFlightAfter)
  // and returns: with the compute ordered after the transfer, or, for a request, with the
  // transfer's end in *request_end for its Wait to order the compute after.
  //
  // The call's deadline and its wait_seconds start once that compute has finished, not at
  // the call: the GPU runs behind the host (by up to the rest of a backward pass when the
  // call reduces an early gradient bucket), and a backlog of our own kernels is neither a
  // sign of a hung peer nor time spent waiting for one.
  Status Run(const char* op, const Enqueue& enqueue, cudaEvent_t marked = nullptr,
             std::shared_ptr<const CudaEvent>* request_end = nullptr) REQUIRES(mu_);

  // Runs `enqueue` on the communicator and the group's stream; its failures (bad arguments,
  // a peer that failed at once) break the group.
  Status EnqueueNow(const Enqueue& enqueue) REQUIRES(mu_) {
    if (!error_.ok()) return error_;
    Status enqueued = enqueue(comm_, stream_);
    return enqueued.ok() ? enqueued : Break(std::move(enqueued));
  }

  // A new event (CudaEvent::Create); a failure breaks the group.
  StatusOr<std::shared_ptr<const CudaEvent>> NewEvent(bool timing, const std::string& where)
      REQUIRES(mu_) {
    StatusOr<std::shared_ptr<const CudaEvent>> event = CudaEvent::Create(timing, where);
    if (!event.ok()) return Break(event.status());
    return event;
  }

  // Stream order: a timing event recorded on the group's stream now, where a transfer
  // enqueued next starts (once the compute it follows and the group's earlier transfers
  // are done).
  StatusOr<std::shared_ptr<const CudaEvent>> RecordOnStream(const std::string& where)
      REQUIRES(mu_) {
    ASSIGN_OR_RETURN(std::shared_ptr<const CudaEvent> event, NewEvent(/*timing=*/true, where));
    RETURN_IF_ERROR(Check(cudaEventRecord(event->get(), stream_), "cudaEventRecord", where));
    return event;
  }

  // Stream order, once a transfer was enqueued behind `started`: waits for NCCL to have
  // finished enqueueing it (the communicator is nonblocking; the group's first transfer
  // also connects), records its end, makes the compute stream wait for that end when
  // `compute_waits` (else a request's Wait does), and hands the transfer to the watchdog,
  // which holds its deadline. Returns the end's event.
  StatusOr<std::shared_ptr<const CudaEvent>> InFlightAfter(const char* op,
                                                           std::shared_ptr<const CudaEvent> started,
                                                           bool compute_waits) REQUIRES(mu_);

  // Stream order: the compute enqueued from now on runs after `done` (a transfer's end).
  // What the compute stream stalls there, from reaching that point to the transfer's end,
  // is the rank's wait (wait_seconds), counted once both have passed (Advance).
  Status ComputeWaitsFor(const std::string& where, std::shared_ptr<const CudaEvent> done)
      REQUIRES(mu_);

  // Returns once every transfer in flight has completed and the compute stream has passed
  // each of its waits for them (Communicator::Sync), or with the group's error: the
  // deadlines are Advance's, as the watchdog's.
  Status Sync() REQUIRES(mu_);

  // Communicator::wait_seconds: Run's transfers and the requests' waits; stream-ordered,
  // the compute stream's stalls for them, once Advance has seen each pass.
  double wait_seconds() const { return waited_.seconds(); }
  void AddWait(NcclClock::duration waited) { waited_.Add(waited); }

  // How long the next transfer may take: first_timeout_ for the group's first one.
  std::chrono::milliseconds NextTimeout() REQUIRES(mu_) {
    const auto allowed = used_ ? timeout_ : first_timeout_;
    used_ = true;
    return allowed;
  }

  // Polls until NCCL has finished enqueueing (it is nonblocking) and then `done` says
  // true; fails (and aborts the communicator) on NCCL's asynchronous error, on an error of
  // `done`, or at `deadline`.
  Status Poll(const char* op, NcclClock::time_point deadline,
              const std::function<StatusOr<bool>()>& done,
              const char* cause = "a peer hangs or is slow") REQUIRES(mu_);

  // The call's Status (CudaNcclStatus); a failure breaks the group.
  template <typename Result>
  Status Check(Result result, const char* call, const std::string& where) REQUIRES(mu_) {
    Status status = CudaNcclStatus(result, call, where);
    return status.ok() ? status : Break(std::move(status));
  }

  // Keeps the first error and aborts the communicator: after an error NCCL's state is
  // unknown and only ncclCommAbort frees a rank stuck in a collective (and, stream-ordered,
  // the compute waiting for it). Returns the first error.
  Status Break(Status status) REQUIRES(mu_);

  // Logs what a destructor cannot return.
  static void Log(const Status& status);

 private:
  // Where the compute stream waits for a stream-ordered transfer's end (ComputeWaitsFor).
  struct Stall {
    std::shared_ptr<const CudaEvent> reached;  // on the compute stream, before its wait
    std::shared_ptr<const CudaEvent> done;     // the transfer's end
  };

  // A stream-ordered transfer that its call returned before it ran (Advance).
  struct InFlight {
    const char* op;
    std::shared_ptr<const CudaEvent> started;  // the group's stream reached the transfer
    std::shared_ptr<const CudaEvent> done;     // the transfer ended
    std::chrono::milliseconds timeout;
    NcclClock::time_point enqueued;
    std::optional<NcclClock::time_point> began;  // when `started` was first seen passed
  };

  Status InitLocked(const ncclUniqueId& id, NcclClock::time_point deadline) REQUIRES(mu_);

  // NCCL's asynchronous error into *state (ncclInProgress while it is still enqueueing);
  // an error breaks the group.
  Status AsyncError(const std::string& where, ncclResult_t* state) REQUIRES(mu_);

  static Status Overdue(const std::string& where, NcclClock::duration allowed, const char* cause) {
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(allowed);
    return DeadlineExceededError(where + ": not complete within " + std::to_string(ms.count()) +
                                 " ms (" + cause + "); communicator aborted");
  }

  // Stream order: retires the transfers in flight that have ended, oldest first (the group's
  // stream runs them in order), and the compute stream's stalls for them that have passed,
  // adding each stall to wait_seconds (from the compute reaching its wait, so a rank's own
  // backlog does not count, as in Run). Breaks the group on NCCL's asynchronous error, when
  // the oldest transfer has not ended within its timeout of its start (the compute it
  // follows and the group's transfers before it done), or has not started within
  // kComputeBacklogLimit of its call (a kernel before it never ends). Returns the group's
  // error.
  Status Advance() REQUIRES(mu_);

  // Advance's stalls, in the order the compute stream meets them.
  Status RetireStalls() REQUIRES(mu_);

  // The watchdog of a stream-ordered group: while transfers are in flight, Advance every
  // kWatchPeriod, so that a hung one is aborted at its deadline even while the training
  // thread waits on the device (for the compute behind it) and makes no call. An error it
  // finds is logged here and returned by the group's next call or Sync.
  void Watch() EXCLUDES(mu_);

  const std::string name_;
  const int rank_;
  const int size_;
  const int device_;
  const cudaStream_t after_;  // the compute stream, or null
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds first_timeout_;
  const bool stream_ordered_;
  // How long a call waits for the compute it is ordered after (Run).
  static constexpr std::chrono::minutes kComputeBacklogLimit{5};
  // How often the watchdog looks at the transfers in flight: a deadline's resolution.
  static constexpr std::chrono::milliseconds kWatchPeriod{5};
  // Set by Init, before the group is shared; then constant.
  cudaStream_t stream_ = nullptr;  // every NCCL call of the group; owned
  cudaEvent_t ordered_ = nullptr;  // OrderAfterCompute's
  float* scalar_ = nullptr;        // device memory: the barrier's all-reduce operand

  Mutex mu_;
  bool used_ GUARDED_BY(mu_) = false;          // a transfer has been enqueued (NextTimeout)
  ncclComm_t comm_ GUARDED_BY(mu_) = nullptr;  // null before Init and after an abort
  Status error_ GUARDED_BY(mu_);
  std::deque<InFlight> in_flight_ GUARDED_BY(mu_);  // stream order: oldest first
  std::deque<Stall> stalls_ GUARDED_BY(mu_);        // in the compute stream's order
  bool stopping_ GUARDED_BY(mu_) = false;
  CondVar watch_;         // the watchdog's: transfers in flight, or stopping
  std::thread watchdog_;  // stream-ordered groups only
  WaitTally waited_;
};

}  // namespace drover::engine::parallel
