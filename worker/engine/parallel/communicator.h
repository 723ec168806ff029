// Collective and point-to-point communication within one group of ranks (DESIGN.md
// "Parallelism"): the world, or one axis of the device mesh (dp, pp, tp), or a small
// group such as the first and last pipeline stage that share the tied embedding.
//
// One interface, one implementation per backend: Gloo over TCP on host memory
// (gloo_communicator.h) and NCCL on device memory (nccl_communicator.h, built with CUDA).
// The engine holds a Communicator per group and never names the backend.
//
// Contract of every call:
// - Every rank of the group makes the same calls in the same order with the same sizes
//   (counts, types, root, tags); a mismatch is a bug of the caller, not an input error.
// - Each call returns within the communicator's timeout (CommOptions::timeout), end to end:
//   OK; DeadlineExceeded when a peer did not take part in time (it hangs, or is slow);
//   Unavailable when a peer's connection closed (it died). The message names the group,
//   the operation and, where known, the peer. After any error the communicator is broken:
//   every later call fails at once (the trainer's answer is to exit and be restarted).
// - Data pointers are host memory for Gloo and device memory for NCCL. Buffers may not be
//   touched by the caller until the call (or, for the async calls, Wait) returns.
// - Stream order (CommOptions::stream_ordered, NCCL): a call, or a request's Wait, may return
//   once its transfer is enqueued on the device, before it has run. Its buffer is then ready
//   for the compute the caller enqueues after the return (kernels, and the kernel table's
//   ToHost, which follows them), never for the host directly; and its failure, a deadline
//   included, is reported by a later call or by Sync. A call on host memory (staged), Barrier
//   and Sync still return complete. Deadlines hold without a caller: a watchdog aborts the
//   group when a transfer outlives its timeout, which releases the compute waiting for it.
// - Results of AllReduce and AllGather are bitwise identical on every rank, so replicated
//   parameters that are updated from them stay identical without further checks.
//
// Thread-safety: one thread at a time per Communicator (the engine gives a communicator to
// one thread: the dp group's to its CommStream, the others to the training thread).
// Different communicators of one process may be used from different threads at once.
// wait_seconds() may be read, and MarkCompute() called, from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace drover::engine::parallel {

enum class DataType { kFloat32, kFloat64 };
enum class ReduceOp { kSum, kAverage };

// Bytes of one element of `type`.
size_t SizeOf(DataType type);

struct CommOptions {
  // Deadline of every call (and of connecting the group). A few seconds on CPU catches a
  // dead or hung peer quickly; the spec's parallel.timeout_s sets it for real jobs.
  std::chrono::milliseconds timeout{10'000};
  // Calls on device memory may return once their transfer is enqueued, ordered before the
  // compute the caller enqueues next (Communicator's "stream order"). Backends without a
  // compute stream (Gloo) ignore it. For groups used by the training thread, whose next
  // kernels read the result: the host keeps its lead over the GPU through them.
  bool stream_ordered = false;
};

// A send or receive in flight (Isend / Irecv). Wait returns within the communicator's
// timeout, counted from the call that started it. Destroying a request that was never
// waited for waits for it (and drops its status): buffers must outlive their requests.
class Request {
 public:
  virtual ~Request() = default;
  virtual Status Wait() = 0;
};

// Time a rank spent waiting in a group's calls: added to by the thread that uses the
// group, read by any (the training thread reads the dp group's while its CommStream adds).
class WaitTally {
 public:
  void Add(std::chrono::steady_clock::duration waited) {
    ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count(),
                  std::memory_order_relaxed);
  }
  double seconds() const { return static_cast<double>(ns_.load(std::memory_order_relaxed)) * 1e-9; }

 private:
  std::atomic<int64_t> ns_{0};
};

// Collectives a rank runs beside its own compute: a CommStream's thread reduces gradient
// buckets while the training thread goes on with backward. A group would count all of such
// a call as waiting, the compute it overlapped included (Gloo from the call, NCCL from the
// GPU reaching it): a rank then looks idle for the backward that ran beside its reductions,
// on a GPU even with no straggler, since every transfer takes time. So each group leaves
// those calls out of wait_seconds() and marks the thread's flag instead (Gloo itself; NCCL,
// whose groups live in the CUDA plugin, through cuda_groups.cc's wrapper), and the stream
// counts what the rank stalled for them: from its own compute having finished (on a GPU,
// the kernels enqueued before it waits) to the work's end (CommStream::Wait,
// overlapped_waits_seconds).
class OverlappedCalls {
 public:
  // From now on the calling thread's collectives run beside the rank's compute; a group
  // that leaves one uncounted sets *left_uncounted.
  static void Enter(std::atomic<bool>* left_uncounted);
  // The flag of the calling thread; nullptr where Enter was not called.
  static std::atomic<bool>* Current();
};

// A point in a rank's device work, marked by the thread that enqueued that work
// (Communicator::MarkCompute). Opaque; what it holds is the group's (an NCCL group's: an
// event recorded on the compute stream). May be dropped on any thread.
class ComputeMark {
 public:
  virtual ~ComputeMark() = default;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name, for messages ("dp", "tp[pp=1,dp=0]", "world", ...).
  virtual const std::string& name() const = 0;

  // data (count elements of `type`) becomes the element-wise reduction over the group.
  virtual Status AllReduce(void* data, size_t count, DataType type, ReduceOp op) = 0;

  // data holds sum(counts) elements: chunk r is [sum(counts[0..r)), + counts[r]) and
  // counts.size() == size(). On return chunk rank() holds the reduction of every rank's
  // chunk rank(); the other chunks hold partial sums (scratch). A ring moves
  // (size - 1) / size of the buffer per rank. Zero counts are allowed.
  virtual Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                               ReduceOp op) = 0;

  // data holds sum(counts) elements laid out as for ReduceScatter. On entry chunk rank()
  // holds this rank's part; on return every chunk holds its owner's part (in place).
  virtual Status AllGather(void* data, std::span<const size_t> counts, DataType type) = 0;

  // data (count elements) of rank `root` is copied to every rank.
  virtual Status Broadcast(void* data, size_t count, DataType type, int root) = 0;

  // Point to point. Messages between two ranks with the same tag arrive in the order they
  // were sent; a receive must name the sender's byte count exactly.
  virtual StatusOr<std::unique_ptr<Request>> Isend(const void* data, size_t bytes, int peer,
                                                   uint64_t tag) = 0;
  virtual StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int peer,
                                                   uint64_t tag) = 0;
  Status Send(const void* data, size_t bytes, int peer, uint64_t tag);
  Status Recv(void* data, size_t bytes, int peer, uint64_t tag);

  // Returns once every rank of the group has called it.
  virtual Status Barrier() = 0;

  // Returns once every call made so far has completed: OK, or the first error of any. A
  // stream-ordered group's calls may still be running after they return; a trainer syncs
  // before it trusts what they computed (a step's end, a checkpoint). Other groups' calls
  // return complete, and their errors were returned then: OK.
  virtual Status Sync() { return OkStatus(); }

  // A collective handed to another thread (a CommStream's gradient bucket) is made when that
  // thread gets to it, and a group that orders its calls after the compute stream (NCCL)
  // orders it after everything enqueued by then: on a GPU, where the host runs ahead by up
  // to the rest of backward, a reduction meant to run beside backward would wait for all of
  // it (and so would every bucket after a slow one). So the thread that enqueued the call's
  // inputs marks its compute at once (MarkCompute, after their kernels), and the thread that
  // makes the call hands the mark to FollowMark just before it: that call then follows the
  // compute enqueued before the mark, as the inputs need, and nothing later.
  //
  // MarkCompute may be called from any thread, also while another thread uses the group; null
  // from a group with nothing to order (host memory: Gloo). A staged group passes on its
  // inner group's marks, and a mark only with a buffer that is not staged (its copy is made
  // at the call). A mark that could not be made is null.
  virtual std::shared_ptr<const ComputeMark> MarkCompute() { return nullptr; }
  // The next collective the calling thread makes on the group follows `mark` (null: the
  // compute enqueued at the call, as without one). Only a mark taken after every kernel
  // that writes the call's inputs was enqueued is safe to give.
  virtual void FollowMark(std::shared_ptr<const ComputeMark>) {}

  // The deadline of every call.
  virtual std::chrono::milliseconds timeout() const = 0;

  // Seconds this rank has spent in the group's calls since it connected, counted from the
  // moment its own part of each call was ready: the whole call for Gloo; for NCCL from the
  // compute the call follows having finished on the GPU to the transfer's end (the GPU runs
  // behind the host, so the call's host time would count this rank's own kernels too).
  // Calls made beside the rank's compute are left out (OverlappedCalls). It is waiting for the
  // slowest peer plus the transfer itself: in a group where one rank is slow, that rank
  // waits least, which is how a straggler shows (trainer.h's busy_ms).
  virtual double wait_seconds() const = 0;
};

}  // namespace drover::engine::parallel
