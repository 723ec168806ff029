// CUDA versions as the driver and the runtime give them (cuDriverGetVersion,
// cudaRuntimeGetVersion: 1000 x major + 10 x minor), for messages about which serves which:
// the agent's start-up check (worker/gpu_probe.h) and the CUDA plugin's (device_check.cu).
#pragma once

#include <string>

namespace drover {

// "12.8" for 12080.
inline std::string CudaVersionName(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

}  // namespace drover
