#include "cli/device_flags.h"

#include <CLI/CLI.hpp>

#include "worker/engine/kernels/cuda_backend.h"

namespace drover::cli {

void AddDeviceOptions(CLI::App* app, DeviceFlags* flags, bool with_precision) {
  app->add_option("--device", flags->device,
                  "cpu | cuda: where the model runs (default cpu; cuda takes the first GPU of "
                  "CUDA_VISIBLE_DEVICES)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  if (with_precision) {
    app->add_option("--precision", flags->precision,
                    "fp32 | bf16 | fp16: the compute precision, as a job's precision.dtype "
                    "(default fp32)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  }
}

StatusOr<engine::Ops*> OpsFor(const DeviceFlags& flags) {
  if (flags.device != "cuda") return engine::CpuOps();
  StatusOr<engine::Ops*> ops = engine::CudaOps();
  if (!ops.ok()) return ops.status().WithContext("--device cuda");
  return ops;
}

engine::Precision PrecisionOf(const DeviceFlags& flags) {
  auto p = engine::ParsePrecision(flags.precision);
  DROVER_CHECK_OK(p.status());
  return *p;
}

}  // namespace drover::cli
