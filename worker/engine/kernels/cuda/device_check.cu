// Whether this build's kernels run on the GPU at all, asked once when a table is made
// (cuda_ops.cu), so that a GPU they were not compiled for (an A100, compute capability 8.0,
// under the default sm_90 build) fails the job at its start with what to rebuild, where it
// failed at the first kernel of the first step with "no kernel image is available"; and,
// before that, why the runtime found no GPU at all, in words that say what to change (the
// runtime's own "CUDA driver version is insufficient for CUDA runtime version" is what a
// machine with no driver at all gets too).
#include <string>

#include "common/cuda_version.h"
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

std::string NoUsableGpuWhy(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "the driver lists none (check CUDA_VISIBLE_DEVICES and nvidia-smi)";
    case cudaErrorInsufficientDriver: {
      // The runtime's answer both where the driver is older than it and where there is none:
      // the driver's version tells the two apart (0 where none is installed).
      int driver = 0, runtime = 0;
      (void)cudaDriverGetVersion(&driver);
      (void)cudaRuntimeGetVersion(&runtime);
      if (driver == 0) {
        return "no NVIDIA driver is installed on this machine (libcuda.so.1 cannot be loaded): "
               "a CUDA job needs one; CPU jobs run without it";
      }
      return "the NVIDIA driver supports CUDA " + drover::CudaVersionName(driver) +
             " and this build's CUDA runtime is " + drover::CudaVersionName(runtime) +
             ": update the driver (nvidia-smi shows its version), or build drover with a CUDA "
             "toolkit the driver supports";
    }
    case cudaErrorStubLibrary:
      return "the CUDA driver library loaded is the toolkit's stub (a libcuda.so from a "
             "stubs/ directory, found first through LD_LIBRARY_PATH or the linker's cache): "
             "install the NVIDIA driver, or take the stubs directory out of the library path";
    case cudaErrorSystemDriverMismatch:
      return "the NVIDIA kernel module and the driver library (libcuda) are of different "
             "versions, as after a driver update without a reboot: reboot, or reload the "
             "nvidia kernel modules";
    case cudaErrorNoDevice:
      return std::string(cudaGetErrorString(err)) + " (check CUDA_VISIBLE_DEVICES and nvidia-smi)";
    default:
      return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
  }
}

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
