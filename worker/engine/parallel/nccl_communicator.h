// The NCCL backend of Communicator (communicator.h): device memory, one CUDA stream.
//
// Built into the CUDA plugin (libdrover_cuda.so, with NCCL where the build found it), never
// into a program: the engine reaches it through kernels/cuda_backend.h's ConnectNcclGroup,
// so programs start on machines without NCCL. The kernel emulator runs it on an emulated
// NCCL (tests/cuda_emu); it has not run on a GPU yet.
//
// Every call enqueues its NCCL work on the group's own communication stream, behind an
// event recorded on `after` (the kernel table's compute stream) at the call, so a transfer
// starts only once the kernels enqueued before the call have written its buffer, while
// kernels enqueued later (the rest of backward) run beside it. A collective made on another
// thread than the one that enqueued its inputs follows the event MarkCompute recorded on
// that thread instead, when FollowMark gave it one (communicator.h): a gradient bucket's
// reduction, made by a CommStream's thread once the one before it has finished, would
// otherwise wait for all the backward the host had enqueued by then. The call returns when the
// group's stream has drained (or, for Isend / Irecv, the request's Wait returns when an
// event recorded after the transfer has fired). Completion is polled, never waited out:
// cudaStreamQuery / cudaEventQuery and ncclCommGetAsyncError, against the call's deadline:
// CommOptions::timeout from the moment the compute the call follows has finished (the
// group's first transfer gets the connect timeout, as NCCL connects to peers lazily).
// On a deadline the communicator calls ncclCommAbort,
// which is the only way to get a rank out of a collective whose peer hangs, and is broken
// from then on (communicator.h).
//
// Stream order (CommOptions::stream_ordered, the training thread's groups): a call returns
// once NCCL has enqueued its transfer, with the compute stream made to wait for the
// transfer's end (a request: at its Wait), so the host keeps its lead over the GPU through
// tensor parallel's all-reduces and the pipeline's transfers (a call that returned only
// once done would leave the GPU idle at each while the host enqueued the kernels after it,
// four times a layer under tp). The call's deadline (from the transfer's start on the group's
// stream, i.e. once the compute it follows and the group's earlier transfers are done) is then held
// by the group's watchdog thread, which polls the transfers in flight, oldest first, every few
// milliseconds and aborts the communicator at a deadline or on NCCL's asynchronous error: the abort
// ends the transfer, which releases the compute waiting for it, and the error is returned by the
// group's next call or Sync. The rank's wait (wait_seconds) is what its compute stream
// stalled for each transfer, timed by events (from reaching its wait to the transfer's end),
// and counted once both have passed (Sync counts them all). A lock serialises the group's
// users: the calling thread and the watchdog, which never meet inside NCCL.
//
// Algorithms: AllReduce, Broadcast: NCCL's, in place; kAverage is ncclAvg. ReduceScatter
// and AllGather with equal counts: ncclReduceScatter / ncclAllGather in place. With uneven
// counts: one ncclReduce (ReduceScatter) or ncclBroadcast (AllGather) per non-empty chunk,
// rooted at the chunk's owner, fused in one ncclGroupStart/End: in place, with neither a
// padded scratch copy nor a reduction kernel of our own, and each chunk still crosses the
// ring once. Barrier: an all-reduce of one float.
//
// Point to point: NCCL matches sends and receives between two ranks in call order and has
// no tags; `tag` is ignored, so a receiver must post its receives in the order the sender
// posted the sends. Each Isend / Irecv is its own group on the one stream: two ranks that
// both send before they receive deadlock (until the timeout). Order exchanges so that one
// side receives first (e.g. even ranks send first, odd ranks receive first).
//
// Thread-safety: communicator.h's (one thread at a time; the watchdog is the group's own).
// Every call makes `device` current on the calling thread.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::parallel {

// Connects rank `rank` of `group_name` (`size` ranks) on CUDA device `device`: rank 0
// creates the NCCL unique id and publishes it in `store` under "<group_name>/nccl/", the
// others read it; the communicator is initialised nonblocking and polled until ready or
// `connect_timeout` (then DeadlineExceeded). The group creates its communication stream;
// `after` (may be null: no ordering) must outlive the communicator; `store` is used only
// during this call. NCCL refuses two ranks of one group on one GPU.
StatusOr<std::unique_ptr<Communicator>> ConnectNcclGroup(KvStore* store,
                                                         const std::string& group_name, int rank,
                                                         int size, int device, cudaStream_t after,
                                                         const CommOptions& options,
                                                         std::chrono::milliseconds connect_timeout);

}  // namespace drover::engine::parallel
