// Checking macros for the CUDA backend: every CUDA runtime and cuBLAS call goes through
// one. The kernel table's calls return nothing (kernels/ops.h), so a failure inside a step
// (an illegal address, a launch that cannot run) is a broken invariant: the process stops
// with the call, file:line and the library's own words, and the agent reports the exit.
// Set-up failures (no device, no cuBLAS) are returned as text by CreateCudaOps instead.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace drover::engine::cuda {

[[noreturn]] inline void CudaFail(const char* what, const char* detail, const char* file,
                                  int line) {
  std::fprintf(stderr, "%s:%d: CUDA call failed: %s: %s\n", file, line, what, detail);
  std::fflush(stderr);
  std::abort();
}

}  // namespace drover::engine::cuda

#define DROVER_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    const cudaError_t drover_cuda_err = (expr);                                              \
    if (drover_cuda_err != cudaSuccess) {                                                    \
      ::drover::engine::cuda::CudaFail(#expr, cudaGetErrorString(drover_cuda_err), __FILE__, \
                                       __LINE__);                                            \
    }                                                                                        \
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
