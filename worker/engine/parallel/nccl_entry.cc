// The CUDA plugin's entry point for NCCL groups (cuda_groups.h: ConnectNcclFn). Built into
// libdrover_cuda.so only, like nccl_communicator.cc.
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "worker/engine/kernels/cuda/ops_cuda.h"
#include "worker/engine/kernels/cuda_backend.h"
#include "worker/engine/parallel/cuda_groups.h"
#ifdef DROVER_HAVE_NCCL
#include "worker/engine/parallel/nccl_communicator.h"
#endif

namespace {

int Fail(drover::StatusCode code, const std::string& message, char* error, size_t error_len) {
  std::snprintf(error, error_len, "%s", message.c_str());
  return static_cast<int>(code);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int drover_connect_nccl_group(
    int abi, drover::engine::Ops* ops, drover::engine::parallel::KvStore* store, const char* group,
    int rank, int size, int64_t timeout_ms, int64_t connect_timeout_ms, int stream_ordered,
    drover::engine::parallel::Communicator** out, char* error, size_t error_len) {
  using drover::StatusCode;
  static_assert(std::is_same_v<decltype(&drover_connect_nccl_group),
                               drover::engine::parallel::ConnectNcclFn>);
  if (abi != drover::engine::kCudaOpsAbi) {
    return Fail(StatusCode::kFailedPrecondition,
                "the CUDA backend was built for ABI " +
                    std::to_string(drover::engine::kCudaOpsAbi) + ", this program has " +
                    std::to_string(abi) + " (rebuild them together)",
                error, error_len);
  }
  cudaStream_t compute = drover::engine::cuda::ComputeStreamOf(ops);
  if (compute == nullptr) {
    return Fail(
        StatusCode::kInvalidArgument,
        std::string("NCCL group \"") + group + "\": the kernel table is not the CUDA plugin's own",
        error, error_len);
  }
#ifdef DROVER_HAVE_NCCL
  drover::engine::parallel::CommOptions options;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  options.stream_ordered = stream_ordered != 0;
  auto comm = drover::engine::parallel::ConnectNcclGroup(
      store, group, rank, size, /*device=*/0, compute, options,
      std::chrono::milliseconds(connect_timeout_ms));
  if (!comm.ok()) return Fail(comm.status().code(), comm.status().message(), error, error_len);
  *out = comm->release();
  return 0;
#else
  (void)store, (void)rank, (void)size, (void)timeout_ms, (void)connect_timeout_ms,
      (void)stream_ordered, (void)out;
  return Fail(StatusCode::kFailedPrecondition,
              std::string("NCCL group \"") + group +
                  "\": this CUDA backend was built without NCCL (parallel.backend gloo works)",
              error, error_len);
#endif
}
