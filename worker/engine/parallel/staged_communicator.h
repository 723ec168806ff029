// A Communicator over another that moves only one kind of memory, for a backend whose
// buffers are of both kinds: the engine's arenas live in the kernel table's memory (device
// memory on CUDA), its scalars and gathered checkpoint vectors in host memory. Each call
// given a buffer of the other kind copies it to a staging buffer of the inner kind, runs the
// inner call there, and copies the result back; buffers of the inner kind pass straight
// through, so call sites need not know where a buffer lives (Ops::IsDeviceMemory tells).
//
// - StageThroughHost: the inner moves host memory (Gloo). How a multi-rank CUDA job trains
//   without NCCL (and how two ranks share one GPU, which NCCL refuses): correct on any mesh,
//   at the cost of a device-host round trip per call. With CpuOps nothing is ever staged and
//   the wrapper costs one virtual call per operation.
// - StageThroughDevice: the inner moves device memory (NCCL). The arenas go straight to the
//   inner; the few host buffers make the round trip.
//
// Contract and thread-safety: those of communicator.h, unchanged; in addition `ops`'s
// ToHost / FromHost are called from the thread that uses this communicator (ops.h allows
// it). The staging buffer of the collectives is kept between calls and grows to the largest
// buffer seen: from ops->host_allocator() (page-locked on CUDA) when staging through the
// host, from ops->allocator() when staging through the device. Each Isend / Irecv stages
// into a buffer of its own (through the host: pageable, since page-locking one per message
// would cost more than it saves), released when its request is waited for or destroyed; a
// request must not outlive its communicator.
//
// Through the device, a staged call and a staged request's Wait Sync the inner group before
// the host reads or releases the staged copy, so that a stream-ordered inner (NCCL,
// CommOptions::stream_ordered) has completed, or failed, by then: a host buffer is never
// stream-ordered (communicator.h).
#pragma once

#include <memory>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/parallel/communicator.h"

namespace drover::engine::parallel {

// `inner` is owned; `ops` must outlive the result.
std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> inner, Ops* ops);
std::unique_ptr<Communicator> StageThroughDevice(std::unique_ptr<Communicator> inner, Ops* ops);

}  // namespace drover::engine::parallel
