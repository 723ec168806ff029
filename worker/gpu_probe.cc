#include "worker/gpu_probe.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/cuda_version.h"
#include "worker/shared_library.h"

namespace drover {
namespace {

// The few driver entry points used, by their C signatures (cuda.h: CUresult is an enum,
// CUdevice an int). Declared here so that the agent builds without the CUDA headers.
using CuInit = int (*)(unsigned int);
using CuDeviceGetCount = int (*)(int*);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetName = int (*)(char*, int, int);
using CuDeviceTotalMem = int (*)(size_t*, int);
using CuGetErrorName = int (*)(int, const char**);
using CuDeviceGetAttribute = int (*)(int*, int, int);
using CuDeviceGetPciBusId = int (*)(char*, int, int);
using CuDriverGetVersion = int (*)(int*);
constexpr int kAttributeComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_...
constexpr int kAttributeComputeCapabilityMinor = 76;

// Names of the driver errors a node without a usable GPU meets, for when the driver cannot
// name them itself (the toolkit's stub library cannot). Values from cuda.h.
const char* KnownErrorName(int rc) {
  switch (rc) {
    case 3:
      return "CUDA_ERROR_NOT_INITIALIZED";
    case 34:
      return "CUDA_ERROR_STUB_LIBRARY (the toolkit's stub, not a driver)";
    case 35:
      return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 46:
      return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case 100:
      return "CUDA_ERROR_NO_DEVICE";
    case 101:
      return "CUDA_ERROR_INVALID_DEVICE";
    case 304:
      return "CUDA_ERROR_OPERATING_SYSTEM";
    case 802:
      return "CUDA_ERROR_SYSTEM_NOT_READY";
    case 803:
      return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case 804:
      return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    default:
      return "an unnamed CUDA driver error";
  }
}

}  // namespace

StatusOr<std::vector<GpuInfo>> ProbeGpus(const std::string& driver_library) {
  SharedLibrary lib(driver_library);
  if (!lib.ok()) {
    return FailedPreconditionError("no NVIDIA driver on this node: " + driver_library +
                                   " cannot be loaded (" + lib.error() + ")");
  }
  auto init = lib.Get<CuInit>("cuInit");
  auto count = lib.Get<CuDeviceGetCount>("cuDeviceGetCount");
  auto get = lib.Get<CuDeviceGet>("cuDeviceGet");
  auto get_name = lib.Get<CuDeviceGetName>("cuDeviceGetName");
  auto total_mem = lib.Get<CuDeviceTotalMem>("cuDeviceTotalMem_v2");
  auto error_name = lib.Get<CuGetErrorName>("cuGetErrorName");
  auto attribute = lib.Get<CuDeviceGetAttribute>("cuDeviceGetAttribute");
  auto bus_id = lib.Get<CuDeviceGetPciBusId>("cuDeviceGetPCIBusId");
  if (!init || !count || !get || !get_name || !total_mem) {
    return FailedPreconditionError(driver_library +
                                   " is not a usable CUDA driver: it lacks the device queries");
  }
  auto describe = [&](const char* call, int rc) {
    const char* name = nullptr;
    if (error_name == nullptr || error_name(rc, &name) != 0 || name == nullptr) {
      name = KnownErrorName(rc);
    }
    return FailedPreconditionError("CUDA driver: " + std::string(call) + " failed: " + name + " (" +
                                   std::to_string(rc) + ")");
  };
  if (int rc = init(0); rc != 0) return describe("cuInit", rc);
  int n = 0;
  if (int rc = count(&n); rc != 0) return describe("cuDeviceGetCount", rc);
  if (n == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return FailedPreconditionError(
        std::string("no CUDA device is visible") +
        (visible ? " (CUDA_VISIBLE_DEVICES='" + std::string(visible) + "')" : ""));
  }
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    if (int rc = get(&dev, i); rc != 0) return describe("cuDeviceGet", rc);
    char name[256] = {};
    if (int rc = get_name(name, sizeof(name) - 1, dev); rc != 0) {
      return describe("cuDeviceGetName", rc);
    }
    size_t bytes = 0;
    if (int rc = total_mem(&bytes, dev); rc != 0) return describe("cuDeviceTotalMem", rc);
    int major = 0, minor = 0;
    if (attribute == nullptr || attribute(&major, kAttributeComputeCapabilityMajor, dev) != 0 ||
        attribute(&minor, kAttributeComputeCapabilityMinor, dev) != 0) {
      major = minor = 0;  // not known: the trainer's own check decides (device_check.cu)
    }
    char bus[32] = {};
    if (bus_id == nullptr || bus_id(bus, sizeof(bus) - 1, dev) != 0) bus[0] = '\0';
    gpus.push_back({i, name, static_cast<int64_t>(bytes), major * 10 + minor, bus});
  }
  return gpus;
}

namespace {
std::string CapabilityName(int cc) {
  return std::to_string(cc / 10) + "." + std::to_string(cc % 10);
}

}  // namespace

int DriverCudaVersion(const std::string& driver_library) {
  SharedLibrary lib(driver_library);
  if (!lib.ok()) return 0;
  auto get = lib.Get<CuDriverGetVersion>("cuDriverGetVersion");
  int version = 0;
  if (get == nullptr || get(&version) != 0) return 0;
  return version;
}

int BuildCudaRuntimeVersion() {
#ifdef DROVER_CUDA_RUNTIME_VERSION
  return DROVER_CUDA_RUNTIME_VERSION;
#else
  return 0;
#endif
}

Status CheckDriverServesRuntime(int driver_version, int runtime_version) {
  if (driver_version == 0 || runtime_version == 0) return OkStatus();
  if (driver_version / 1000 >= runtime_version / 1000) return OkStatus();
  const std::string major = std::to_string(runtime_version / 1000);
  return FailedPreconditionError(
      "the NVIDIA driver supports CUDA " + CudaVersionName(driver_version) +
      " and this build's CUDA runtime is " + CudaVersionName(runtime_version) +
      ", which needs a driver of CUDA " + major +
      ".0 or newer: every trainer here would fail at its start. Update the driver (nvidia-smi "
      "shows its version), or run a drover built with a CUDA toolkit the driver supports");
}

Status CheckComputeCapability(const std::vector<GpuInfo>& gpus) {
  for (const GpuInfo& g : gpus) {
    if (g.compute_capability == 0 || g.compute_capability >= kMinComputeCapability) continue;
    return FailedPreconditionError(
        "GPU " + std::to_string(g.index) + " (" + g.name + ") has compute capability " +
        CapabilityName(g.compute_capability) + "; drover's CUDA kernels need " +
        CapabilityName(kMinComputeCapability) +
        " or newer (leave it out with CUDA_VISIBLE_DEVICES, or run this node with --device cpu)");
  }
  return OkStatus();
}

std::string GpuSlotDescription(int slot, const GpuInfo& gpu) {
  std::string what = "cuda:" + std::to_string(slot) + " " + gpu.name + " (" +
                     std::to_string(gpu.memory_bytes >> 30) + " GiB";
  if (gpu.compute_capability != 0) what += ", compute " + CapabilityName(gpu.compute_capability);
  return what + ")";
}

std::string VisibleDeviceForSlot(int slot, const std::string& agent_visible) {
  if (agent_visible.empty()) return std::to_string(slot);
  std::stringstream list(agent_visible);
  std::string entry;
  for (int i = 0; std::getline(list, entry, ','); ++i) {
    if (i == slot) return entry;
  }
  return std::to_string(slot);  // more slots than listed devices: refused at start-up
}

std::string VisibleDeviceForLocalRank(int rank, const std::vector<std::string>& gpus) {
  if (gpus.empty()) return "";
  return gpus[static_cast<size_t>(rank) % gpus.size()];
}

int LocalRanksOnGpuOf(int rank, int nproc, int gpus) {
  if (gpus <= 0) return 1;
  // Ranks rank % gpus, + gpus, + 2 gpus, ... below nproc.
  return (nproc - rank % gpus + gpus - 1) / gpus;
}

double DenseTensorPeakTflops(const std::string& name) {
  // The name's words, upper-cased ("NVIDIA A100-SXM4-80GB": NVIDIA A100 SXM4 80GB).
  std::vector<std::string> words;
  std::string word;
  for (char c : name + " ") {
    if (c == ' ' || c == '-') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
  }
  auto has = [&](const char* w) { return std::find(words.begin(), words.end(), w) != words.end(); };
  // Variants before their family (an H100 NVL is an H100 too), whole words only (an L4 is
  // no L40). NVIDIA's datasheet figures with sparsity halved.
  struct Known {
    const char* model;
    const char* variant;  // nullptr: any
    double tflops;
  };
  static constexpr Known kKnown[] = {
      {"H200", "NVL", 835},    {"H200", nullptr, 989}, {"H100", "NVL", 835},
      {"H100", "PCIE", 756},   {"H100", nullptr, 989}, {"GH200", nullptr, 989},
      {"H800", "PCIE", 756},   {"H800", nullptr, 989}, {"H20", nullptr, 148},
      {"B200", nullptr, 2250}, {"A100", nullptr, 312}, {"A800", nullptr, 312},
      {"A30", nullptr, 165},   {"A40", nullptr, 150},  {"A10", nullptr, 125},
      {"L40S", nullptr, 362},  {"L40", nullptr, 181},  {"L4", nullptr, 121},
  };
  for (const Known& k : kKnown) {
    if (has(k.model) && (k.variant == nullptr || has(k.variant))) return k.tflops;
  }
  return 0;
}

StatusOr<double> PeakTflopsOfThisRank(const std::string& device, int ranks_on_gpu,
                                      const std::string& driver_library) {
  if (const char* set = std::getenv(kEnvPeakTflops); set != nullptr && *set != '\0') {
    char* end = nullptr;
    const double tflops = std::strtod(set, &end);
    if (end == set || *end != '\0' || !std::isfinite(tflops) || tflops <= 0) {
      return InvalidArgumentError(std::string(kEnvPeakTflops) + "='" + set +
                                  "' is not a positive number of TFLOP/s");
    }
    return tflops;
  }
  if (device != "cuda") return 0.0;
  StatusOr<std::vector<GpuInfo>> gpus = ProbeGpus(driver_library);
  if (!gpus.ok() || gpus->empty()) return 0.0;  // the kernel table says why, if it matters
  return DenseTensorPeakTflops(gpus->front().name) / std::max(1, ranks_on_gpu);
}

}  // namespace drover
