// The device options of the commands that run a model outside a job (drover eval, drover
// sample), and the kernel table they name. One build serves CPU and GPU machines: the CUDA
// table is loaded only when --device cuda asks for it (kernels/cuda_backend.h).
#pragma once

#include <string>

#include "common/status.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/kernels/precision.h"

namespace CLI {
class App;
}

namespace drover::cli {

struct DeviceFlags {
  std::string device = "cpu";
  std::string precision = "fp32";
};

// --device cpu|cuda, and --precision fp32|bf16|fp16 where `with_precision`.
void AddDeviceOptions(CLI::App* app, DeviceFlags* flags, bool with_precision);

// The kernel table of flags.device: CpuOps, or the CUDA plugin's; FailedPrecondition with
// the reason where this build or this machine cannot run CUDA (no plugin, no driver, no
// usable GPU).
StatusOr<engine::Ops*> OpsFor(const DeviceFlags& flags);

// flags.precision as a Precision (the options' check allows only the three names).
engine::Precision PrecisionOf(const DeviceFlags& flags);

}  // namespace drover::cli
