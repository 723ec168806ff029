// Checking macros for the CUDA backend: every CUDA runtime and cuBLAS call goes through
// one. The kernel table's calls return nothing (kernels/ops.h), so a failure inside a step
// (an illegal address, a launch that cannot run) is a broken invariant: the process stops
// with the call, file:line and the library's own words, and the agent reports the exit.
// An error that says the GPU itself failed (IsDeviceFault) exits with kExitDeviceFault
// instead of aborting, so that the coordinator cordons that GPU rather than blaming the job.
// Set-up failures (no device, no cuBLAS) are returned as text by CreateCudaOps instead.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "common/exit_codes.h"

namespace drover::engine::cuda {

[[noreturn]] inline void CudaFail(const char* what, const char* detail, const char* file,
                                  int line) {
  std::fprintf(stderr, "%s:%d: CUDA call failed: %s: %s\n", file, line, what, detail);
  std::fflush(stderr);
  std::abort();
}

// Whether a CUDA error says that the GPU failed or cannot be used, rather than that the
// program misused it: the slot is at fault, not the job. These are CUDA's errors that name
// the hardware, the device's presence, or the node's driver. An illegal address, an illegal
// instruction or a launch failure is left out: far more often a kernel's bug than the GPU's,
// and cordoning a good GPU for a bug would only move the bug onto the next one.
inline bool IsDeviceFault(cudaError_t err) {
  switch (err) {
    case cudaErrorECCUncorrectable:      // the GPU's memory
    case cudaErrorNvlinkUncorrectable:   // its NVLink
    case cudaErrorDevicesUnavailable:    // held by another process (exclusive compute mode)
    case cudaErrorNoDevice:              // gone from the bus, or not visible to this process
    case cudaErrorInvalidDevice:         // the slot's ordinal names no GPU
    case cudaErrorSystemNotReady:        // an NVSwitch system whose fabric manager is down
    case cudaErrorInsufficientDriver:    // the node's driver is older than this runtime
    case cudaErrorSystemDriverMismatch:  // its kernel module and user-space driver differ
    case cudaErrorStubLibrary:           // the node has the toolkit's stub, not a driver
      return true;
    default:
      return false;
  }
}

// Stops the process because its GPU failed (IsDeviceFault), with kExitDeviceFault: the
// agent reports the code, and the coordinator cordons the slot and restarts the job on the
// others. The line is the trainer's last, which the job's failure reason quotes.
[[noreturn]] inline void DeviceFailed(const char* what, cudaError_t err, const char* file,
                                      int line) {
  std::fprintf(stderr,
               "%s:%d: the GPU failed: %s: %s (%s); exit code %d: the GPU's fault, not the job's\n",
               file, line, what, cudaGetErrorName(err), cudaGetErrorString(err),
               static_cast<int>(kExitDeviceFault));
  std::fflush(stderr);
  std::_Exit(kExitDeviceFault);
}

[[noreturn]] inline void CudaCallFailed(const char* what, cudaError_t err, const char* file,
                                        int line) {
  if (IsDeviceFault(err)) DeviceFailed(what, err, file, line);
  CudaFail(what, cudaGetErrorString(err), file, line);
}

}  // namespace drover::engine::cuda

#define DROVER_CUDA_CHECK(expr)                                                           \
  do {                                                                                    \
    const cudaError_t drover_cuda_err = (expr);                                           \
    if (drover_cuda_err != cudaSuccess) {                                                 \
      ::drover::engine::cuda::CudaCallFailed(#expr, drover_cuda_err, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)

#define DROVER_CUBLAS_CHECK(expr)                                                                \
  do {                                                                                           \
    const cublasStatus_t drover_cublas_st = (expr);                                              \
    if (drover_cublas_st != CUBLAS_STATUS_SUCCESS) {                                             \
      ::drover::engine::cuda::CudaFail(#expr, cublasGetStatusString(drover_cublas_st), __FILE__, \
                                       __LINE__);                                                \
    }                                                                                            \
  } while (0)

// After a kernel launch: a bad configuration shows here, at the launch, not at the next
// synchronising call.
#define DROVER_CUDA_LAUNCHED() DROVER_CUDA_CHECK(cudaGetLastError())

// A precondition of a launcher (shapes the kernel assumes).
#define DROVER_CUDA_REQUIRE(cond)                                                             \
  do {                                                                                        \
    if (!(cond)) ::drover::engine::cuda::CudaFail("precondition", #cond, __FILE__, __LINE__); \
  } while (0)
