// The CUDA kernel table, loaded at run time. Its kernels and the CUDA libraries they need
// (cudart, cuBLAS) live in a plugin, libdrover_cuda.so, built beside the programs when nvcc
// is found. Programs never link it: a trainer opens it only when a job asks for
// resources.device cuda, so one build runs CPU jobs on machines with no GPU driver or CUDA
// libraries at all.
#pragma once

#include "common/status.h"
#include "worker/engine/kernels/ops.h"

namespace drover::engine {

// Bumped whenever kernels/ops.h changes: a plugin built from another ops.h is refused
// rather than called through a vtable that does not match.
// Also covers the plugin's other entry points (parallel/cuda_groups.h) and the interfaces
// they pass across (Communicator, KvStore, Status).
// 3: GEMM precision, Synchronize; 4: NCCL groups; 5: AttentionStateFloats;
// 6: AdamWUpdateSegments; 7: activation outputs stored in the run's precision;
// 12: CrossEntropyForwardBackward; 13: AttentionBackward reads the forward's out;
// 14: MatmulGeluForward and GeluMatmulBackward; 15: LayerNormBackward's dout_operand;
// 16: AttentionBackward's dout_operand; 17: RoundCopy; 18: LayerNormBackward's dinp_copy,
// GeluMatmulBackward's dout_operand; 19: device_bytes; 20: kCreateDeviceFault;
// 21: Communicator::MarkCompute / FollowMark.
inline constexpr int kCudaOpsAbi = 22;

// The plugin's one entry point (extern "C"): on success *ops is a table for device 0 of
// those visible (CUDA_VISIBLE_DEVICES), living until exit, and 0 is returned; otherwise a
// message is written to error (NUL-terminated, at most error_len bytes) and -1 returned,
// or kCreateDeviceFault where the GPU itself failed or cannot be used (none visible, an
// uncorrectable error, held by another process: cuda/cuda_check.h, IsDeviceFault).
using CreateCudaOpsFn = int (*)(int abi, Ops** ops, char* error, size_t error_len);
inline constexpr int kCreateDeviceFault = -2;
inline constexpr char kCreateCudaOpsSymbol[] = "drover_create_cuda_ops";
inline constexpr char kCudaPluginName[] = "libdrover_cuda.so";

// Opens the plugin (next to the running program, else through the library path) once per
// process and returns its table. FailedPrecondition with the reason when this build has no
// CUDA plugin, its libraries cannot be loaded, or no GPU is usable; the caller names what
// asked for CUDA (a job's resources.device, a command's --device).
StatusOr<Ops*> CudaOps();

// Whether CudaOps failed because the GPU itself failed or cannot be used (the plugin's
// kCreateDeviceFault), not because this build or node cannot run CUDA jobs at all. A
// trainer under an agent then exits with kExitDeviceFault (common/exit_codes.h), so that
// the coordinator cordons that GPU; `drover train` keeps the usage error's exit code.
bool CudaDeviceFailed();

// A symbol of the plugin (opened as for CudaOps), for its entry points beside the table's.
// FailedPrecondition as CudaOps, or naming the symbol when the plugin lacks it.
StatusOr<void*> CudaPluginSymbol(const char* symbol);

}  // namespace drover::engine
