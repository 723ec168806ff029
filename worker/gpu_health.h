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
// not unfit for it).
//
// Xid events are the driver's reports of an error, by number (NVIDIA's Xid catalogue), and
// unlike the states above they are gone once read: WaitForXid hands them on, and the
// monitor (gpu_health_monitor.h) keeps a GPU that had a critical one out of use until an
// operator puts it back (drover uncordon) or the agent restarts. Some Xids name an application's
// fault, not the GPU's (an illegal address, a kernel past its time slice): the trainer that
// caused one fails by itself, and they are left alone (kApplicationXids).
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

// The Xids an application's own error causes, left alone by default (--gpu-ignored-xids):
// 13 graphics engine exception, 31 memory page fault, 43 GPU stopped processing, 45
// preemptive cleanup, 68 video processor exception, 109 context switch timeout.
inline constexpr int kApplicationXids[] = {13, 31, 43, 45, 68, 109};

// The finding for critical Xid `xid` on the GPU at `bus_id`, seen at `wall_ms` (Unix ms).
std::string XidFault(const std::string& bus_id, uint64_t xid, int64_t wall_ms);

// A list of Xids as --gpu-ignored-xids takes it: "13,31,43" (numbers, commas), or "none" or
// "" for none. InvalidArgument naming the entry otherwise.
StatusOr<std::vector<int>> ParseXidList(const std::string& text);

// Why clocks held down by `reasons` (NVML's clocks event reasons, a bit mask) slow a GPU, for
// people: "thermal (hardware)", "power brake (hardware)", "thermal (driver)", "hardware
// slowdown", joined by ", "; "" when none of those bits is set. Idling, application clocks,
// sync boost and the power cap are left out: a GPU under full load sits at its power cap.
std::string SlowdownReasons(uint64_t reasons);

// One Xid event: `gpu` is an index into the GPUs Open was given, or -1 when NVML did not
// say which GPU (it may then be any of them); `xid` is 999 when NVML does not know it.
struct XidEvent {
  int gpu = -1;
  uint64_t xid = 0;
};

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

  // What NVML reads of gpus[i] now (utilisation, memory, temperature, power, slowdown);
  // nullopt when it is not checked or lost. Fields NVML does not answer are left absent.
  // Thread-safe as CheckOne.
  std::optional<v1::GpuTelemetry> Telemetry(int i);

  // Whether some GPU is watched for Xid events (its driver offers them, Open registered it).
  bool watches_xids() const;

  // Waits up to `timeout_ms` for NVML's next Xid event about a watched GPU; nullopt when
  // none came. A wait that fails (a GPU lost, NVML's error) returns nullopt after the
  // whole timeout, so that a caller's loop never spins. One thread at a time; beside
  // CheckOne's callers.
  std::optional<XidEvent> WaitForXid(int timeout_ms);

  int size() const;           // the GPUs Open was given
  bool checked(int i) const;  // whether NVML found gpus[i] (or found it lost)
  int checked() const;        // how many it found
  int slot(int i) const;      // gpus[i].index, the slot its findings name
  const std::string& bus_id(int i) const;

 private:
  struct Nvml;
  explicit GpuHealthCheck(std::unique_ptr<Nvml> nvml);
  // Registers each GPU found for Xid events, where its driver offers them (a warning where not).
  static void RegisterForXids(Nvml* nvml);
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace drover
