// Whether this build's kernels run on the GPU at all, asked once when a table is made
// (cuda_ops.cu), so that a GPU they were not compiled for (an A100, compute capability 8.0,
// under the default sm_90 build) fails the job at its start with what to rebuild, where it
// failed at the first kernel of the first step with "no kernel image is available".
#include <string>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/launch.h"
#include "worker/engine/kernels/cuda/ops_cuda.h"

// The compute capabilities the plugin's machine code and PTX were built for
// (CMAKE_CUDA_ARCHITECTURES, commas for semicolons; worker/CMakeLists.txt).
#ifndef DROVER_CUDA_ARCHS
#define DROVER_CUDA_ARCHS "90"
#endif

namespace drover::engine::cuda {
namespace {

__global__ void ProbeKernel() {}

// The device's compute capability as major * 10 + minor (80 for 8.0); 0 where the driver
// does not say.
int ComputeCapability() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

}  // namespace

cudaError_t KernelsRunOnDevice(cudaStream_t stream, std::string* why) {
  DROVER_LAUNCH(ProbeKernel, 1, 1, 0, stream)();
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err == cudaSuccess) return err;
  // Only a missing kernel image says the build does not fit the GPU; a GPU that failed
  // (IsDeviceFault) or another error is told as it is, not as a rebuild to make.
  if (err != cudaErrorNoKernelImageForDevice) {
    *why = std::string(IsDeviceFault(err) ? "the GPU failed: " : "a trivial kernel failed: ") +
           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    return err;
  }
  const int cc = ComputeCapability();
  const std::string name =
      cc == 0 ? std::string("unknown") : std::to_string(cc / 10) + "." + std::to_string(cc % 10);
  *why = std::string("this build's CUDA kernels (CMAKE_CUDA_ARCHITECTURES=") + DROVER_CUDA_ARCHS +
         ") cannot run on this GPU, compute capability " + name + " (" + cudaGetErrorString(err) +
         "): ";
  // bf16 mma.sync and cp.async, which the kernels are built on, came with Ampere (the agent
  // refuses such a GPU at start-up too: gpu_probe.h, kMinComputeCapability).
  if (cc != 0 && cc < 80) {
    *why += "drover's kernels need compute capability 8.0 or newer";
  } else {
    *why += "rebuild with cmake -DCMAKE_CUDA_ARCHITECTURES=" +
            (cc == 0 ? std::string("<this GPU's>") : std::to_string(cc)) +
            " (a list such as \"80;90\" serves both kinds)";
  }
  return err;
}

}  // namespace drover::engine::cuda
