// The node's NVIDIA GPUs as the CUDA driver sees them (CUDA_VISIBLE_DEVICES applies), for
// the agent to register as slots.
//
// The driver library is loaded at run time (dlopen), never linked: one build of the agent
// serves GPU nodes and CPU nodes, and a node without a driver gets a message saying so
// instead of a loader error at start-up. Thread-safe (the driver's own calls are).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace drover {

struct GpuInfo {
  int index = 0;  // CUDA device ordinal, as this process sees them
  std::string name;
  int64_t memory_bytes = 0;
  int compute_capability = 0;  // major * 10 + minor (90: an H100 or H200); 0 if not known
  // "0000:19:00.0": how NVML finds the same GPU (gpu_health.h), whatever the ordinals; empty
  // when the driver does not say.
  std::string pci_bus_id;
};

// The oldest compute capability drover's CUDA kernels run on (bf16 mma.sync and cp.async
// came with Ampere, 8.0), whatever the build's CMAKE_CUDA_ARCHITECTURES.
inline constexpr int kMinComputeCapability = 80;

// The visible GPUs, in ordinal order. FailedPrecondition naming the cause when there are
// none to use: no driver library (`driver_library` cannot be loaded), the driver refuses
// to initialise (its error name, e.g. CUDA_ERROR_NO_DEVICE), or no device is visible.
StatusOr<std::vector<GpuInfo>> ProbeGpus(const std::string& driver_library = "libcuda.so.1");

// FailedPrecondition naming the first GPU of `gpus` older than kMinComputeCapability (its
// ordinal, name and compute capability), and how to leave it out; OK otherwise.
Status CheckComputeCapability(const std::vector<GpuInfo>& gpus);

// The CUDA version the driver `driver_library` supports (cuDriverGetVersion: 1000 x major +
// 10 x minor, 12080 for 12.8); 0 when it cannot be loaded or does not say.
int DriverCudaVersion(const std::string& driver_library = "libcuda.so.1");

// The CUDA runtime version this build's CUDA plugin was built with (the toolkit's, in the
// same units); 0 for a build without CUDA.
int BuildCudaRuntimeVersion();

// FailedPrecondition naming both versions and what to do when a driver of `driver_version`
// cannot serve a runtime of `runtime_version`: its major version is older (a runtime serves
// every driver of its own major version or newer, CUDA's minor version compatibility). OK
// when either is 0 (not known: the trainer's own start-up says what fails).
Status CheckDriverServesRuntime(int driver_version, int runtime_version);

// A slot's description for `drover workers`: "cuda:0 NVIDIA H200 (139 GiB, compute 9.0)".
std::string GpuSlotDescription(int slot, const GpuInfo& gpu);

// The dense (no sparsity) bf16 / fp16 tensor-core peak of a GPU named `name` as the driver
// names it ("NVIDIA H100 80GB HBM3"), in TFLOP/s, from NVIDIA's datasheets; 0 for a GPU not
// known here. The denominator of a run's model FLOPs utilisation, for every precision
// (fp32 runs use a fraction of what the chip has, and MFU says so). A GPU held to lower
// clocks by its power cap reaches less: an H200 measured 771 TFLOP/s in bf16 GEMMs against
// the 989 here (tests/device/speed.sh measures its own rate).
double DenseTensorPeakTflops(const std::string& name);

// The variable that sets a trainer's peak TFLOP/s (PeakTflopsOfThisRank): for hardware not
// known here, or to count MFU against a measured rate.
inline constexpr char kEnvPeakTflops[] = "DROVER_PEAK_TFLOPS";

// The peak TFLOP/s that this process's MFU counts against, for a job on `device` ("cpu" or
// "cuda"): DROVER_PEAK_TFLOPS when set (InvalidArgument, naming it, when it is not a
// positive number), else for "cuda" the first visible GPU's DenseTensorPeakTflops shared by
// the `ranks_on_gpu` ranks that use that GPU (0 when the driver does not answer or the GPU
// is not known), else 0: unknown, no MFU reported.
StatusOr<double> PeakTflopsOfThisRank(const std::string& device, int ranks_on_gpu = 1,
                                      const std::string& driver_library = "libcuda.so.1");

// What CUDA_VISIBLE_DEVICES a trainer on `slot` gets: the slot-th entry of the agent's own
// CUDA_VISIBLE_DEVICES when that is set (`agent_visible`, comma-separated), else the slot
// number. So a trainer sees exactly one GPU, as its device 0.
std::string VisibleDeviceForSlot(int slot, const std::string& agent_visible);

// What CUDA_VISIBLE_DEVICES local rank `rank` of `drover train --nproc` gets on a machine with
// `gpus` (the launcher's CUDA_VISIBLE_DEVICES entries, else the probed ordinals): a GPU of
// its own while there are enough, else the ranks share them round-robin (their groups then
// stage through the host: NCCL refuses two ranks on one GPU). Empty when `gpus` is.
std::string VisibleDeviceForLocalRank(int rank, const std::vector<std::string>& gpus);
// How many of `nproc` local ranks share local rank `rank`'s GPU (itself included) when they
// are spread over `gpus` GPUs as VisibleDeviceForLocalRank spreads them; 1 when gpus is 0.
int LocalRanksOnGpuOf(int rank, int nproc, int gpus);

}  // namespace drover
