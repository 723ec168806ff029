// A Communicator over another that only moves host memory (Gloo), for a backend whose
// arenas live in device memory: each call copies the device buffers it is given to host
// memory, runs the inner call there, and copies the result back. Host buffers (the
// engine's scalars, gathered checkpoint vectors) pass straight through, so call sites need
// not know where a buffer lives; Ops::IsDeviceMemory tells them apart.
//
// This is how a multi-rank CUDA job trains without NCCL process groups (and how two ranks
// share one GPU, which NCCL refuses): correct on any mesh, at the cost of a device-host
// round trip per call. With CpuOps nothing is ever staged and the wrapper costs one
// virtual call per operation.
//
// Contract and thread-safety: those of communicator.h, unchanged; in addition `ops`'s
// ToHost / FromHost are called from the thread that uses this communicator (ops.h allows
// it). The staging buffer of the collectives comes from ops->host_allocator() (page-locked
// on CUDA), is kept between calls and grows to the largest buffer seen; each Isend / Irecv
// stages into a pageable buffer of its own (page-locking one per message would cost more
// than it saves), released when its request is waited for or destroyed.
#pragma once

#include <memory>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/parallel/communicator.h"

namespace drover::engine::parallel {

// `inner` is owned; `ops` must outlive the result.
std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> inner, Ops* ops);

}  // namespace drover::engine::parallel
