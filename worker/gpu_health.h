// The agent's health check of its GPUs, through NVML (the NVIDIA Management Library): a GPU
// that fell off the bus, that has had an uncorrectable memory error since its last reset,
// or whose memory waits for a reset to remap a row, is unfit for training. The agent reports
// such a slot in every heartbeat (HeartbeatRequest.unhealthy_slots) and the coordinator
// keeps it out of use, and stops the attempt running on it, before a trainer meets the fault
// as a failed CUDA call (kExitDeviceFault), or never does and computes on bad memory.
//
// The states checked are the GPU's own, not events: each clears when the GPU is mended (a
// reset clears the volatile error count and makes a pending remap), so the slot returns to
// service by itself. So does an NVLink that was up when the check began and is down now
// (links down from the start are left alone: a GPU cabled so, or with links unused, is
// not unfit for it). Xid events are not watched.
//
// NVML is loaded at run time (dlopen), never linked: one build serves nodes with and without
// GPUs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/drover.pb.h"
#include "worker/gpu_probe.h"

namespace drover {

// What NVML says of one GPU, the parts that tell one unfit for training.
struct GpuHealthReading {
  bool lost = false;                   // NVML_ERROR_GPU_IS_LOST: fallen off the bus
  uint64_t uncorrected_errors = 0;     // volatile: since the driver loaded or its last reset
  bool row_remap_pending = false;      // a row of its memory is remapped at its next reset
  bool row_remap_failed = false;       // a row could not be remapped: it needs service
  std::vector<int> nvlinks_down = {};  // links up when the check began, down now
};

// Why a GPU reading `r` must not run trainers, with what would mend it; "" when it may.
std::string GpuFault(const GpuHealthReading& r);

class GpuHealthCheck {
 public:
  // Loads NVML from `library` and finds each of `gpus` by its PCI bus id (GpuInfo.pci_bus_id:
  // NVML numbers the node's GPUs its own way, whatever CUDA_VISIBLE_DEVICES says).
  // FailedPrecondition naming the cause when the library cannot be loaded or initialised.
  // A GPU NVML cannot find is left unchecked, with a warning.
  static StatusOr<std::unique_ptr<GpuHealthCheck>> Open(
      const std::vector<GpuInfo>& gpus, const std::string& library = "libnvidia-ml.so.1");
  ~GpuHealthCheck();
  GpuHealthCheck(const GpuHealthCheck&) = delete;
  GpuHealthCheck& operator=(const GpuHealthCheck&) = delete;

  // Every slot (an index of `gpus`) whose GPU is unfit now: CheckOne of each, in order.
  std::vector<v1::SlotHealth> Check();

  // gpus[i]'s finding if it is unfit now, with GpuFault's reason, which names the GPU;
  // nullopt when it is fit or not checked. A query that fails otherwise than with a lost GPU
  // (not supported, no permission) counts as a healthy answer: only what NVML reports as
  // wrong takes a GPU out. May be called from several threads at once (NVML is thread-safe;
  // this object is not changed after Open), as GpuHealthMonitor does, one per GPU.
  std::optional<v1::SlotHealth> CheckOne(int i);

  int size() const;           // the GPUs Open was given
  bool checked(int i) const;  // whether NVML found gpus[i] (or found it lost)
  int checked() const;        // how many it found
  int slot(int i) const;      // gpus[i].index, the slot its findings name
  const std::string& bus_id(int i) const;

 private:
  struct Nvml;
  explicit GpuHealthCheck(std::unique_ptr<Nvml> nvml);
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace drover
