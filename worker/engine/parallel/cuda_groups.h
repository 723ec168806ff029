// The process groups of a CUDA job. Two ways to move its device buffers between ranks:
// - NCCL (parallel.backend nccl, or auto when every rank has a GPU of its own): device
//   memory to device memory, through the NCCL communicator that lives in the CUDA plugin
//   (nccl_communicator.h; programs never link NCCL, as they never link CUDA), wrapped by
//   StageThroughDevice for the engine's few host buffers;
// - Gloo staged through the host (StageThroughHost): any mesh, ranks sharing a GPU too,
//   which NCCL refuses.
// The choice is the same on every rank: each publishes its GPU in the attempt's store and
// every rank decides from the same list (ChooseNccl, a pure function).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::parallel {

// The plugin's entry points beside the kernel table's (kernels/cuda_backend.h: same ABI
// number, same error convention).
//
// drover_cuda_device: writes the PCI bus id of this process's GPU (device 0 of those
// visible) to bus_id and 1 to *has_nccl when the plugin was built with NCCL; 0 on success.
using CudaDeviceFn = int (*)(int abi, char* bus_id, size_t bus_id_len, int* has_nccl, char* error,
                             size_t error_len);
inline constexpr char kCudaDeviceSymbol[] = "drover_cuda_device";
// drover_connect_nccl_group: nccl_communicator.h's ConnectNcclGroup on device 0, ordered
// after `ops`'s compute stream (`ops` must be the plugin's own table), stream-ordered when
// `stream_ordered` is 1 (CommOptions). Returns 0 and sets *out (owned by the caller), or
// returns a StatusCode and writes its message to `error`.
using ConnectNcclFn = int (*)(int abi, Ops* ops, KvStore* store, const char* group, int rank,
                              int size, int64_t timeout_ms, int64_t connect_timeout_ms,
                              int stream_ordered, Communicator** out, char* error,
                              size_t error_len);
inline constexpr char kConnectNcclSymbol[] = "drover_connect_nccl_group";

struct CudaDevice {
  std::string id;     // "<host name>/<PCI bus id>": equal only for one physical GPU
  bool nccl = false;  // this rank's CUDA plugin has NCCL
};

// This process's GPU, through the plugin (loading it). FailedPrecondition as CudaOps.
StatusOr<CudaDevice> LocalCudaDevice();

// Publishes `mine` as rank `rank`'s and returns every rank's, by rank; DeadlineExceeded when
// a rank does not publish within `timeout`.
StatusOr<std::vector<CudaDevice>> ExchangeCudaDevices(KvStore* store, int rank, int world,
                                                      const CudaDevice& mine,
                                                      std::chrono::milliseconds timeout);

struct BackendChoice {
  bool nccl = false;
  std::string reason;  // for the log: why this one
};

// Whether the ranks with `devices` talk through NCCL under parallel.backend `backend` (auto,
// gloo or nccl): auto takes NCCL when every rank has NCCL and a GPU no other rank has.
// FailedPrecondition when nccl is asked for and cannot be had, naming the ranks and GPU.
StatusOr<BackendChoice> ChooseNccl(const std::string& backend,
                                   const std::vector<CudaDevice>& devices);

// Connects one NCCL group through the plugin (see ConnectNcclFn).
StatusOr<std::unique_ptr<Communicator>> ConnectNcclThroughPlugin(
    Ops* ops, KvStore* store, const std::string& group, int rank, int size,
    const CommOptions& options, std::chrono::milliseconds connect_timeout);

}  // namespace drover::engine::parallel
