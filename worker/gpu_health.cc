#include "worker/gpu_health.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <thread>
#include <utility>

#include "worker/shared_library.h"

namespace drover {
namespace {

// The NVML entry points used, by their C signatures (nvml.h: nvmlReturn_t and the counter
// kinds are enums, nvmlDevice_t an opaque pointer). Declared here so that the agent builds
// without NVML's header, which the CUDA toolkit does not ship.
using NvmlDevice = void*;
using NvmlInit = int (*)();
using NvmlShutdown = int (*)();
using NvmlErrorString = const char* (*)(int);
using NvmlGetHandleByPciBusId = int (*)(const char*, NvmlDevice*);
using NvmlGetTotalEccErrors = int (*)(NvmlDevice, int, int, unsigned long long*);
using NvmlGetRemappedRows = int (*)(NvmlDevice, unsigned int*, unsigned int*, unsigned int*,
                                    unsigned int*);
using NvmlGetNvLinkState = int (*)(NvmlDevice, unsigned int, int*);  // nvmlEnableState_t*
struct NvmlUtilization {                                             // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
using NvmlGetUtilization = int (*)(NvmlDevice, NvmlUtilization*);
using NvmlGetMemoryInfo = int (*)(NvmlDevice, NvmlMemory*);
using NvmlGetTemperature = int (*)(NvmlDevice, int, unsigned int*);  // nvmlTemperatureSensors_t
using NvmlGetPowerUsage = int (*)(NvmlDevice, unsigned int*);        // milliwatts
using NvmlGetClocksReasons = int (*)(NvmlDevice, unsigned long long*);
using NvmlEventSet = void*;
struct NvmlEventData {  // nvmlEventData_t, as nvmlEventSetWait_v2 fills it
  NvmlDevice device;
  unsigned long long event_type;
  unsigned long long event_data;  // the Xid, for an Xid event
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
using NvmlEventSetCreate = int (*)(NvmlEventSet*);
using NvmlEventSetFree = int (*)(NvmlEventSet);
using NvmlGetSupportedEventTypes = int (*)(NvmlDevice, unsigned long long*);
using NvmlRegisterEvents = int (*)(NvmlDevice, unsigned long long, NvmlEventSet);
using NvmlEventSetWait = int (*)(NvmlEventSet, NvmlEventData*, unsigned int);
constexpr int kNvmlSuccess = 0;
constexpr unsigned long long kNvmlEventTypeXidCriticalError = 0x8;
constexpr int kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kNvmlErrorGpuIsLost = 15;
constexpr int kNvmlMemoryErrorUncorrected = 1;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kNvmlVolatileEcc = 0;             // NVML_VOLATILE_ECC: since the last reset
constexpr int kNvmlFeatureEnabled = 1;          // NVML_FEATURE_ENABLED: an active link
constexpr unsigned kNvmlMaxLinks = 18;          // NVML_NVLINK_MAX_LINKS (Hopper's 18)

// "NVLink 3" or "NVLinks 3, 5": the links of `links`.
std::string LinkList(const std::vector<int>& links) {
  std::string list = links.size() == 1 ? "NVLink " : "NVLinks ";
  for (size_t i = 0; i < links.size(); ++i) {
    list += (i > 0 ? ", " : "") + std::to_string(links[i]);
  }
  return list;
}

// What NVIDIA's Xid catalogue says an Xid means, for the Xids a GPU fault gives; "" for others.
std::string XidMeaning(uint64_t xid) {
  static constexpr std::pair<uint64_t, const char*> kMeanings[] = {
      {48, "a double-bit ECC error"},
      {63, "a row remap or page retirement recorded"},
      {64, "a row remap or page retirement that failed"},
      {74, "an NVLink error"},
      {79, "fallen off the bus"},
      {92, "a high single-bit ECC error rate"},
      {94, "a contained ECC error"},
      {95, "an uncontained ECC error"},
      {119, "a GSP RPC timeout"},
      {120, "a GSP error"},
      {999, "an Xid NVML does not know"},
  };
  for (const auto& [number, meaning] : kMeanings) {
    if (number == xid) return meaning;
  }
  return "";
}

}  // namespace

std::string SlowdownReasons(uint64_t reasons) {
  // nvmlClocksEventReason* bits. HwThermalSlowdown and HwPowerBrakeSlowdown also set
  // HwSlowdown on some drivers, so it is named alone only when neither is set.
  constexpr uint64_t kHwSlowdown = 0x8, kSwThermal = 0x20, kHwThermal = 0x40, kHwPowerBrake = 0x80;
  std::string why;
  auto add = [&](const char* what) { why += (why.empty() ? "" : ", ") + std::string(what); };
  if (reasons & kHwThermal) add("thermal (hardware)");
  if (reasons & kHwPowerBrake) add("power brake (hardware)");
  if (reasons & kSwThermal) add("thermal (driver)");
  if ((reasons & kHwSlowdown) && !(reasons & (kHwThermal | kHwPowerBrake))) {
    add("hardware slowdown");
  }
  return why;
}

std::string XidFault(const std::string& bus_id, uint64_t xid, int64_t wall_ms) {
  const std::time_t seconds = static_cast<std::time_t>(wall_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
  const std::string meaning = XidMeaning(xid);
  return "GPU " + bus_id + ": Xid " + std::to_string(xid) +
         (meaning.empty() ? "" : " (" + meaning + ")") + " at " + when +
         " (an NVML event): its slot stays out of use until an operator puts it back; reset the "
         "GPU (nvidia-smi -r) or reboot the node, then drover uncordon NODE --slot SLOT";
}

StatusOr<std::vector<int>> ParseXidList(const std::string& text) {
  std::vector<int> xids;
  if (text.empty() || text == "none") return xids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string one = text.substr(start, comma - start);
    const bool digits =
        !one.empty() && one.size() <= 9 && one.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) {
      return InvalidArgumentError("--gpu-ignored-xids: '" + one +
                                  "' is not an Xid; give numbers separated by commas "
                                  "(e.g. 13,31,43), or none");
    }
    xids.push_back(std::stoi(one));
    start = comma + 1;
  }
  return xids;
}

std::string GpuFault(const GpuHealthReading& r) {
  if (r.lost) {
    return "it has fallen off the bus (NVML: GPU is lost): the node needs a GPU reset or a "
           "reboot";
  }
  if (r.row_remap_failed) {
    return "a row of its memory could not be remapped (NVML): the GPU needs service";
  }
  if (r.uncorrected_errors > 0) {
    return std::to_string(r.uncorrected_errors) + " uncorrectable ECC error" +
           (r.uncorrected_errors == 1 ? "" : "s") + " since its last reset (NVML)" +
           (r.row_remap_pending ? ", and a row remap of its memory waits for a reset" : "") +
           ": reset the GPU (nvidia-smi -r)";
  }
  if (r.row_remap_pending) {
    return "a row remap of its memory waits for a reset (NVML): reset the GPU (nvidia-smi -r)";
  }
  if (!r.nvlinks_down.empty()) {
    const bool one = r.nvlinks_down.size() == 1;
    return LinkList(r.nvlinks_down) + (one ? " is" : " are") + " down (" +
           (one ? "it was" : "they were") +
           " up when the agent began checking; NVML): reset the GPU (nvidia-smi -r), or have "
           "its NVLink serviced";
  }
  return "";
}

struct GpuHealthCheck::Nvml {
  explicit Nvml(const std::string& library) : lib(library) {}
  ~Nvml() {
    if (events != nullptr) event_set_free(events);
    if (initialised && shutdown != nullptr) shutdown();
  }
  std::string Error(int rc) const {
    const char* what = error_string != nullptr ? error_string(rc) : nullptr;
    return std::string(what != nullptr ? what : "NVML error") + " (" + std::to_string(rc) + ")";
  }

  SharedLibrary lib;
  bool initialised = false;
  NvmlShutdown shutdown = nullptr;
  NvmlErrorString error_string = nullptr;
  NvmlGetHandleByPciBusId get_handle = nullptr;
  NvmlGetTotalEccErrors ecc_errors = nullptr;   // may be missing: not checked
  NvmlGetRemappedRows remapped_rows = nullptr;  // may be missing (an old driver): not checked
  NvmlGetNvLinkState nvlink_state = nullptr;    // may be missing: not checked
  NvmlGetUtilization utilization = nullptr;     // each may be missing: that field not read
  NvmlGetMemoryInfo memory_info = nullptr;
  NvmlGetTemperature temperature = nullptr;
  NvmlGetPowerUsage power_usage = nullptr;
  NvmlGetClocksReasons clocks_reasons = nullptr;
  NvmlEventSetFree event_set_free = nullptr;
  NvmlEventSetWait event_set_wait = nullptr;
  NvmlEventSet events = nullptr;  // the GPUs' Xid events; null: none watched
  struct Gpu {
    int slot = 0;
    std::string bus_id;
    NvmlDevice device = nullptr;    // null: NVML did not find it, not checked...
    bool lost = false;              // ...unless because it is lost already
    std::vector<int> nvlinks = {};  // active when Open looked: each checked
    bool xids = false;              // watched for Xid events
  };
  std::vector<Gpu> gpus;
};

GpuHealthCheck::GpuHealthCheck(std::unique_ptr<Nvml> nvml) : nvml_(std::move(nvml)) {}
GpuHealthCheck::~GpuHealthCheck() = default;

StatusOr<std::unique_ptr<GpuHealthCheck>> GpuHealthCheck::Open(const std::vector<GpuInfo>& gpus,
                                                               const std::string& library) {
  auto nvml = std::make_unique<Nvml>(library);
  if (!nvml->lib.ok()) {
    return FailedPreconditionError(library + " cannot be loaded (" + nvml->lib.error() + ")");
  }
  auto init = nvml->lib.Get<NvmlInit>("nvmlInit_v2");
  nvml->shutdown = nvml->lib.Get<NvmlShutdown>("nvmlShutdown");
  nvml->error_string = nvml->lib.Get<NvmlErrorString>("nvmlErrorString");
  nvml->get_handle = nvml->lib.Get<NvmlGetHandleByPciBusId>("nvmlDeviceGetHandleByPciBusId_v2");
  nvml->ecc_errors = nvml->lib.Get<NvmlGetTotalEccErrors>("nvmlDeviceGetTotalEccErrors");
  nvml->remapped_rows = nvml->lib.Get<NvmlGetRemappedRows>("nvmlDeviceGetRemappedRows");
  nvml->nvlink_state = nvml->lib.Get<NvmlGetNvLinkState>("nvmlDeviceGetNvLinkState");
  nvml->utilization = nvml->lib.Get<NvmlGetUtilization>("nvmlDeviceGetUtilizationRates");
  nvml->memory_info = nvml->lib.Get<NvmlGetMemoryInfo>("nvmlDeviceGetMemoryInfo");
  nvml->temperature = nvml->lib.Get<NvmlGetTemperature>("nvmlDeviceGetTemperature");
  nvml->power_usage = nvml->lib.Get<NvmlGetPowerUsage>("nvmlDeviceGetPowerUsage");
  // Renamed from "throttle" in CUDA 12.2's NVML; older drivers have only the old name.
  nvml->clocks_reasons =
      nvml->lib.Get<NvmlGetClocksReasons>("nvmlDeviceGetCurrentClocksEventReasons");
  if (nvml->clocks_reasons == nullptr) {
    nvml->clocks_reasons =
        nvml->lib.Get<NvmlGetClocksReasons>("nvmlDeviceGetCurrentClocksThrottleReasons");
  }
  if (init == nullptr || nvml->get_handle == nullptr) {
    return FailedPreconditionError(library + " is not a usable NVML: it lacks nvmlInit_v2 or " +
                                   "nvmlDeviceGetHandleByPciBusId_v2");
  }
  if (int rc = init(); rc != kNvmlSuccess) {
    return FailedPreconditionError("nvmlInit_v2 failed: " + nvml->Error(rc));
  }
  nvml->initialised = true;
  for (const GpuInfo& g : gpus) {
    Nvml::Gpu gpu{g.index, g.pci_bus_id};
    const int rc = g.pci_bus_id.empty() ? -1 : nvml->get_handle(g.pci_bus_id.c_str(), &gpu.device);
    gpu.lost = rc == kNvmlErrorGpuIsLost;  // checked: Check reports it
    if (rc != kNvmlSuccess) {
      gpu.device = nullptr;
      if (!gpu.lost) {
        spdlog::warn("GPU {} ({}) is not health-checked: {}", g.index, g.name,
                     g.pci_bus_id.empty()
                         ? "the driver gave no PCI bus id to find it by in NVML"
                         : "NVML cannot find " + g.pci_bus_id + ": " + nvml->Error(rc));
      }
    }
    if (gpu.device != nullptr && nvml->nvlink_state != nullptr) {
      std::vector<int> down;
      for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
        int active = 0;
        if (nvml->nvlink_state(gpu.device, link, &active) != kNvmlSuccess) continue;
        (active == kNvmlFeatureEnabled ? gpu.nvlinks : down).push_back(static_cast<int>(link));
      }
      if (!down.empty()) {
        spdlog::warn("GPU {} ({}): {} down already; only its links up now are checked", g.index,
                     g.pci_bus_id, LinkList(down));
      }
    }
    nvml->gpus.push_back(std::move(gpu));
  }
  RegisterForXids(nvml.get());
  return std::unique_ptr<GpuHealthCheck>(new GpuHealthCheck(std::move(nvml)));
}

void GpuHealthCheck::RegisterForXids(Nvml* nvml) {
  auto create = nvml->lib.Get<NvmlEventSetCreate>("nvmlEventSetCreate");
  auto supported = nvml->lib.Get<NvmlGetSupportedEventTypes>("nvmlDeviceGetSupportedEventTypes");
  auto register_events = nvml->lib.Get<NvmlRegisterEvents>("nvmlDeviceRegisterEvents");
  nvml->event_set_free = nvml->lib.Get<NvmlEventSetFree>("nvmlEventSetFree");
  nvml->event_set_wait = nvml->lib.Get<NvmlEventSetWait>("nvmlEventSetWait_v2");
  if (create == nullptr || supported == nullptr || register_events == nullptr ||
      nvml->event_set_free == nullptr || nvml->event_set_wait == nullptr) {
    spdlog::warn(
        "Xid events are not watched: this NVML lacks its event API "
        "(nvmlEventSetWait_v2 and the calls beside it)");
    return;
  }
  if (int rc = create(&nvml->events); rc != kNvmlSuccess) {
    nvml->events = nullptr;
    spdlog::warn("Xid events are not watched: nvmlEventSetCreate failed: {}", nvml->Error(rc));
    return;
  }
  for (Nvml::Gpu& gpu : nvml->gpus) {
    if (gpu.device == nullptr) continue;
    unsigned long long types = 0;
    int rc = supported(gpu.device, &types);
    if (rc == kNvmlSuccess && (types & kNvmlEventTypeXidCriticalError) == 0) {
      spdlog::warn("GPU {}: its Xid events are not watched: its driver does not offer them",
                   gpu.bus_id);
      continue;
    }
    if (rc == kNvmlSuccess) {
      rc = register_events(gpu.device, kNvmlEventTypeXidCriticalError, nvml->events);
    }
    if (rc != kNvmlSuccess) {
      spdlog::warn("GPU {}: its Xid events are not watched: {}", gpu.bus_id, nvml->Error(rc));
      continue;
    }
    gpu.xids = true;
  }
}

std::optional<v1::GpuTelemetry> GpuHealthCheck::Telemetry(int i) {
  const Nvml::Gpu& g = nvml_->gpus[static_cast<size_t>(i)];
  if (g.device == nullptr) return std::nullopt;
  v1::GpuTelemetry t;
  t.set_slot(g.slot);
  NvmlUtilization busy{};
  if (nvml_->utilization != nullptr && nvml_->utilization(g.device, &busy) == kNvmlSuccess) {
    t.set_utilization_pct(static_cast<int32_t>(busy.gpu));
  }
  NvmlMemory memory{};
  if (nvml_->memory_info != nullptr && nvml_->memory_info(g.device, &memory) == kNvmlSuccess) {
    t.set_memory_used_bytes(memory.used);
    t.set_memory_total_bytes(memory.total);
  }
  unsigned int celsius = 0;
  if (nvml_->temperature != nullptr &&
      nvml_->temperature(g.device, kNvmlTemperatureGpu, &celsius) == kNvmlSuccess) {
    t.set_temperature_c(static_cast<int32_t>(celsius));
  }
  unsigned int milliwatts = 0;
  if (nvml_->power_usage != nullptr && nvml_->power_usage(g.device, &milliwatts) == kNvmlSuccess) {
    t.set_power_mw(static_cast<int32_t>(milliwatts));
  }
  unsigned long long reasons = 0;
  if (nvml_->clocks_reasons != nullptr &&
      nvml_->clocks_reasons(g.device, &reasons) == kNvmlSuccess) {
    t.set_slowdown(SlowdownReasons(reasons));
  }
  return t;
}

bool GpuHealthCheck::watches_xids() const {
  return std::any_of(nvml_->gpus.begin(), nvml_->gpus.end(),
                     [](const Nvml::Gpu& g) { return g.xids; });
}

std::optional<XidEvent> GpuHealthCheck::WaitForXid(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  NvmlEventData data{};
  const int rc = watches_xids() ? nvml_->event_set_wait(nvml_->events, &data,
                                                        static_cast<unsigned>(timeout_ms))
                                : -1;
  if (rc != kNvmlSuccess || (data.event_type & kNvmlEventTypeXidCriticalError) == 0) {
    std::this_thread::sleep_until(deadline);  // at once on a failed wait: never spin
    return std::nullopt;
  }
  XidEvent event;
  event.xid = data.event_data;
  for (size_t i = 0; i < nvml_->gpus.size(); ++i) {
    if (nvml_->gpus[i].device != nullptr && nvml_->gpus[i].device == data.device) {
      event.gpu = static_cast<int>(i);
    }
  }
  return event;
}

int GpuHealthCheck::size() const { return static_cast<int>(nvml_->gpus.size()); }

bool GpuHealthCheck::checked(int i) const {
  const Nvml::Gpu& g = nvml_->gpus[static_cast<size_t>(i)];
  return g.device != nullptr || g.lost;
}

int GpuHealthCheck::checked() const {
  int n = 0;
  for (int i = 0; i < size(); ++i) n += checked(i) ? 1 : 0;
  return n;
}

int GpuHealthCheck::slot(int i) const { return nvml_->gpus[static_cast<size_t>(i)].slot; }

const std::string& GpuHealthCheck::bus_id(int i) const {
  return nvml_->gpus[static_cast<size_t>(i)].bus_id;
}

std::vector<v1::SlotHealth> GpuHealthCheck::Check() {
  std::vector<v1::SlotHealth> unfit;
  for (int i = 0; i < size(); ++i) {
    if (std::optional<v1::SlotHealth> h = CheckOne(i)) unfit.push_back(std::move(*h));
  }
  return unfit;
}

std::optional<v1::SlotHealth> GpuHealthCheck::CheckOne(int i) {
  if (!checked(i)) return std::nullopt;
  const Nvml::Gpu& g = nvml_->gpus[static_cast<size_t>(i)];
  GpuHealthReading r;
  r.lost = g.lost;
  if (!r.lost && nvml_->ecc_errors != nullptr) {
    unsigned long long count = 0;
    const int rc =
        nvml_->ecc_errors(g.device, kNvmlMemoryErrorUncorrected, kNvmlVolatileEcc, &count);
    r.lost = rc == kNvmlErrorGpuIsLost;
    if (rc == kNvmlSuccess) r.uncorrected_errors = count;
  }
  if (!r.lost && nvml_->remapped_rows != nullptr) {
    unsigned int corrected = 0, uncorrected = 0, pending = 0, failed = 0;
    const int rc = nvml_->remapped_rows(g.device, &corrected, &uncorrected, &pending, &failed);
    r.lost = rc == kNvmlErrorGpuIsLost;
    if (rc == kNvmlSuccess) {
      r.row_remap_pending = pending != 0;
      r.row_remap_failed = failed != 0;
    }
  }
  for (int link : g.nvlinks) {
    if (r.lost) break;
    int active = kNvmlFeatureEnabled;
    const int rc = nvml_->nvlink_state(g.device, static_cast<unsigned>(link), &active);
    r.lost = rc == kNvmlErrorGpuIsLost;
    if (rc == kNvmlSuccess && active != kNvmlFeatureEnabled) r.nvlinks_down.push_back(link);
  }
  const std::string fault = GpuFault(r);
  if (fault.empty()) return std::nullopt;
  v1::SlotHealth h;
  h.set_slot(g.slot);
  h.set_fault("GPU " + g.bus_id + ": " + fault);
  return h;
}

}  // namespace drover
