// A stand-in for the NVIDIA driver library (libcuda.so.1) with the entry points the agent's GPU
// probe calls (worker/gpu_probe.cc), so that the probe's success path is tested where no GPU
// is: the devices are DROVER_FAKE_GPUS, "name,GiB,compute capability" entries separated by
// ';' (e.g. "NVIDIA H200,141,90;Tesla V100-SXM2-16GB,16,70"), read at each call. Device i's
// PCI bus id is "00000000:0i:00.0" unless its entry gives one as a fourth field. Errors are
// the driver's codes (cuda.h): CUDA_ERROR_NO_DEVICE (100) with no devices, INVALID_DEVICE
// (101) for an ordinal past them, INVALID_VALUE (1) otherwise.
//
// It is also the node's NVML (libnvidia-ml.so.1, which the NVIDIA driver ships beside
// libcuda.so.1) for the agent's GPU health check (worker/gpu_health.cc): it finds the same
// devices by their bus ids, and reads what is wrong with them from the file DROVER_FAKE_NVML
// names, at each call: one line per GPU, its bus id then any of "lost" (NVML's GPU_IS_LOST
// from every query), "ecc=N" (N uncorrectable errors since its reset), "remap=pending",
// "remap=failed", "nvlinks=N" (links 0 to N-1 exist; without it NVLink is not supported),
// "down=I,J" (those links inactive), "hang" (a query does not return until the line says otherwise,
// as NVML's do on a wedged driver; the file's name + ".hung" is created once one waits),
// "xid=N,M" (Xid events, each delivered once to each event set that has the GPU, in order),
// "noxid" (its driver offers no Xid events), "util=N" (% busy), "used=N" (GiB of memory in
// use, of the GiB DROVER_FAKE_GPUS gives), "temp=N" (C), "power=N" (W), "reasons=N" (clocks
// event reasons, a decimal bit mask; 0 without it); utilisation, temperature and power are
// NOT_SUPPORTED without their keyword; a line "unattributed xid=N" is an Xid event NVML
// names no GPU for; a line "init N" makes nvmlInit_v2 fail with N, "init hang" never return
// while it is there. A device handle is its ordinal + 1; the codes are nvml.h's: SUCCESS 0,
// INVALID_ARGUMENT 2, NOT_SUPPORTED 3, NOT_FOUND 6, TIMEOUT 10, GPU_IS_LOST 15.
// DROVER_FAKE_CUDA_HANG set: cuInit never returns (a wedged driver). cuDriverGetVersion
// gives DROVER_FAKE_CUDA_VERSION (1000 x major + 10 x minor), else 99000: a driver newer than
// any runtime, so that every build's agent takes it.
#include <strings.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Device {
  std::string name;
  long long gib = 0;
  int capability = 0;
  std::string bus_id;
};

std::vector<Device> Devices() {
  std::vector<Device> devices;
  const char* env = std::getenv("DROVER_FAKE_GPUS");
  std::stringstream list(env != nullptr ? env : "");
  std::string entry;
  while (std::getline(list, entry, ';')) {
    std::stringstream fields(entry);
    Device d;
    std::string gib, capability;
    if (std::getline(fields, d.name, ',') && std::getline(fields, gib, ',') &&
        std::getline(fields, capability, ',')) {
      d.gib = std::atoll(gib.c_str());
      d.capability = std::atoi(capability.c_str());
      if (!std::getline(fields, d.bus_id, ',')) {
        char id[32];
        std::snprintf(id, sizeof(id), "00000000:%02zx:00.0", devices.size());
        d.bus_id = id;
      }
      devices.push_back(d);
    }
  }
  return devices;
}

bool Valid(int device) { return device >= 0 && device < static_cast<int>(Devices().size()); }

}  // namespace

extern "C" {

// DROVER_FAKE_CUDA_HANG set: never returns, as on a wedged driver.
int cuInit(unsigned int) {
  while (std::getenv("DROVER_FAKE_CUDA_HANG") != nullptr) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Devices().empty() ? 100 : 0;
}

int cuDriverGetVersion(int* version) {
  if (version == nullptr) return 1;
  const char* env = std::getenv("DROVER_FAKE_CUDA_VERSION");
  *version = env != nullptr ? std::atoi(env) : 99000;
  return 0;
}

int cuDeviceGetCount(int* count) {
  *count = static_cast<int>(Devices().size());
  return 0;
}

int cuDeviceGet(int* device, int ordinal) {
  if (!Valid(ordinal)) return 101;
  *device = ordinal;
  return 0;
}

int cuDeviceGetName(char* name, int len, int device) {
  if (!Valid(device) || len <= 0) return 1;
  std::strncpy(name, Devices()[static_cast<size_t>(device)].name.c_str(), len - 1);
  name[len - 1] = '\0';
  return 0;
}

int cuDeviceTotalMem_v2(size_t* bytes, int device) {
  if (!Valid(device)) return 101;
  *bytes = static_cast<size_t>(Devices()[static_cast<size_t>(device)].gib) << 30;
  return 0;
}

// CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR (75) and _MINOR (76) only.
int cuDeviceGetAttribute(int* value, int attribute, int device) {
  if (!Valid(device)) return 101;
  const int capability = Devices()[static_cast<size_t>(device)].capability;
  if (attribute == 75) {
    *value = capability / 10;
  } else if (attribute == 76) {
    *value = capability % 10;
  } else {
    return 1;
  }
  return 0;
}

int cuDeviceGetPCIBusId(char* id, int len, int device) {
  if (!Valid(device) || len <= 0) return 1;
  std::strncpy(id, Devices()[static_cast<size_t>(device)].bus_id.c_str(), len - 1);
  id[len - 1] = '\0';
  return 0;
}

int cuGetErrorName(int error, const char** name) {
  *name = error == 100   ? "CUDA_ERROR_NO_DEVICE"
          : error == 101 ? "CUDA_ERROR_INVALID_DEVICE"
                         : "CUDA_ERROR_INVALID_VALUE";
  return 0;
}

}  // extern "C"

namespace {

struct NvmlState {
  int init_error = 0;
  bool init_hangs = false;  // "init hang": nvmlInit_v2 does not return while the line is there
  std::map<std::string, std::string> faults;  // bus id -> the rest of its line
};

NvmlState ReadNvmlState() {
  NvmlState state;
  const char* path = std::getenv("DROVER_FAKE_NVML");
  if (path == nullptr) return state;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream words(line);
    std::string first, rest;
    words >> first;
    std::getline(words, rest);
    if (first == "init") {
      state.init_error = std::atoi(rest.c_str());
      state.init_hangs = rest.find("hang") != std::string::npos;
    } else if (!first.empty()) {
      state.faults[first] = rest + " ";
    }
  }
  return state;
}

// The device behind `handle`, or -1.
int Ordinal(void* handle) {
  const long ordinal = reinterpret_cast<long>(handle) - 1;
  return ordinal >= 0 && ordinal < static_cast<long>(Devices().size()) ? static_cast<int>(ordinal)
                                                                       : -1;
}

// What the state file says of the device behind `handle` ("" when nothing).
std::string Faults(void* handle) {
  const int ordinal = Ordinal(handle);
  if (ordinal < 0) return "";
  NvmlState state = ReadNvmlState();
  auto it = state.faults.find(Devices()[static_cast<size_t>(ordinal)].bus_id);
  return it == state.faults.end() ? "" : it->second;
}

// What the state file says of the device behind `handle`, once it no longer says "hang".
std::string FaultsOnceAnswered(void* handle) {
  std::string faults = Faults(handle);
  if (faults.find("hang ") != std::string::npos) {
    std::ofstream(std::string(std::getenv("DROVER_FAKE_NVML")) + ".hung") << "waiting\n";
  }
  while (faults.find("hang ") != std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    faults = Faults(handle);
  }
  return faults;
}

// The number after `key` ("ecc=") in `faults`, 0 when absent.
long long Value(const std::string& faults, const std::string& key) {
  const size_t at = faults.find(key);
  return at == std::string::npos ? 0 : std::atoll(faults.c_str() + at + key.size());
}

// The numbers of the "key=" list in `faults` ("xid=" of "xid=79,48": 79 and 48).
std::vector<long long> Values(const std::string& faults, const std::string& key) {
  std::vector<long long> values;
  const size_t at = faults.find(key);
  if (at == std::string::npos) return values;
  const size_t from = at + key.size();
  std::stringstream list(faults.substr(from, faults.find(' ', from) - from));
  std::string one;
  while (std::getline(list, one, ',')) {
    if (!one.empty()) values.push_back(std::atoll(one.c_str()));
  }
  return values;
}

constexpr unsigned long long kXidEvents = 0x8;        // nvmlEventTypeXidCriticalError
constexpr unsigned long long kEccEvents = 0x1 | 0x2;  // single- and double-bit ECC

// nvmlEventSet_t: the devices registered, and how many of each one's Xids it has delivered.
struct EventSet {
  std::mutex mu;
  std::vector<void*> devices;
  std::map<std::string, size_t> delivered;  // by bus id, or "unattributed"
};

struct EventData {  // nvmlEventData_t
  void* device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

// The next Xid `set` has not delivered, into `data`; false when there is none.
bool NextXid(EventSet* set, EventData* data) {
  std::lock_guard<std::mutex> lock(set->mu);
  NvmlState state = ReadNvmlState();
  std::vector<std::pair<std::string, void*>> sources = {{"unattributed", nullptr}};
  for (void* device : set->devices) {
    sources.emplace_back(Devices()[static_cast<size_t>(Ordinal(device))].bus_id, device);
  }
  for (const auto& [key, device] : sources) {
    const std::vector<long long> xids = Values(state.faults[key], "xid=");
    size_t& delivered = set->delivered[key];
    if (delivered >= xids.size()) continue;
    *data = {device, kXidEvents, static_cast<unsigned long long>(xids[delivered]), 0xFFFFFFFFu,
             0xFFFFFFFFu};
    ++delivered;
    return true;
  }
  return false;
}

}  // namespace

extern "C" {

int nvmlEventSetCreate(void** set) {
  if (set == nullptr) return 2;
  *set = new EventSet;
  return 0;
}

int nvmlEventSetFree(void* set) {
  delete static_cast<EventSet*>(set);
  return 0;
}

int nvmlDeviceGetSupportedEventTypes(void* device, unsigned long long* types) {
  if (Ordinal(device) < 0 || types == nullptr) return 2;
  const std::string faults = Faults(device);
  if (faults.find("lost ") != std::string::npos) return 15;
  *types = faults.find("noxid ") != std::string::npos ? kEccEvents : kEccEvents | kXidEvents;
  return 0;
}

int nvmlDeviceRegisterEvents(void* device, unsigned long long types, void* set) {
  if (Ordinal(device) < 0 || set == nullptr) return 2;
  unsigned long long supported = 0;
  if (int rc = nvmlDeviceGetSupportedEventTypes(device, &supported); rc != 0) return rc;
  if ((types & ~supported) != 0) return 3;
  auto* events = static_cast<EventSet*>(set);
  std::lock_guard<std::mutex> lock(events->mu);
  events->devices.push_back(device);
  return 0;
}

int nvmlEventSetWait_v2(void* set, EventData* data, unsigned int timeout_ms) {
  if (set == nullptr || data == nullptr) return 2;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!NextXid(static_cast<EventSet*>(set), data)) {
    if (std::chrono::steady_clock::now() >= deadline) return 10;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return 0;
}

struct Utilization {  // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
struct Memory {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// The value of `key` on the device's line into `out`: SUCCESS, or NOT_SUPPORTED without it,
// GPU_IS_LOST for a lost GPU, INVALID_ARGUMENT for an unknown handle.
int Reading(void* device, const std::string& key, unsigned int* out) {
  if (Ordinal(device) < 0 || out == nullptr) return 2;
  const std::string faults = FaultsOnceAnswered(device);
  if (faults.find("lost ") != std::string::npos) return 15;
  if (faults.find(key) == std::string::npos) return 3;
  *out = static_cast<unsigned int>(Value(faults, key));
  return 0;
}

int nvmlDeviceGetUtilizationRates(void* device, Utilization* busy) {
  if (busy == nullptr) return 2;
  busy->memory = 0;
  return Reading(device, "util=", &busy->gpu);
}

int nvmlDeviceGetMemoryInfo(void* device, Memory* memory) {
  const int ordinal = Ordinal(device);
  if (ordinal < 0 || memory == nullptr) return 2;
  const std::string faults = FaultsOnceAnswered(device);
  if (faults.find("lost ") != std::string::npos) return 15;
  memory->total = static_cast<unsigned long long>(Devices()[static_cast<size_t>(ordinal)].gib)
                  << 30;
  memory->used = static_cast<unsigned long long>(Value(faults, "used=")) << 30;
  memory->free = memory->total - memory->used;
  return 0;
}

// NVML_TEMPERATURE_GPU (0) only: the agent's query.
int nvmlDeviceGetTemperature(void* device, int sensor, unsigned int* celsius) {
  return sensor != 0 ? 2 : Reading(device, "temp=", celsius);
}

int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  const int rc = Reading(device, "power=", milliwatts);
  if (rc == 0) *milliwatts *= 1000;
  return rc;
}

int nvmlDeviceGetCurrentClocksEventReasons(void* device, unsigned long long* reasons) {
  unsigned int bits = 0;
  const int rc = Reading(device, "reasons=", &bits);
  if (rc != 0 && rc != 3) return rc;
  *reasons = bits;
  return 0;
}

int nvmlInit_v2() {
  while (ReadNvmlState().init_hangs) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return ReadNvmlState().init_error;
}

int nvmlShutdown() { return 0; }

const char* nvmlErrorString(int result) {
  switch (result) {
    case 0:
      return "Success";
    case 6:
      return "Not Found";
    case 9:
      return "Driver Not Loaded";
    case 15:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}

int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  if (bus_id == nullptr || device == nullptr) return 2;
  const std::vector<Device> devices = Devices();
  for (size_t i = 0; i < devices.size(); ++i) {
    if (strcasecmp(devices[i].bus_id.c_str(), bus_id) != 0) continue;
    *device = reinterpret_cast<void*>(static_cast<long>(i) + 1);
    return 0;
  }
  return 6;
}

// NVML_MEMORY_ERROR_TYPE_UNCORRECTED (1) and NVML_VOLATILE_ECC (0) only: the agent's query.
int nvmlDeviceGetTotalEccErrors(void* device, int error_type, int counter_type,
                                unsigned long long* count) {
  if (Ordinal(device) < 0 || error_type != 1 || counter_type != 0 || count == nullptr) return 2;
  const std::string faults = FaultsOnceAnswered(device);
  if (faults.find("lost ") != std::string::npos) return 15;
  *count = static_cast<unsigned long long>(Value(faults, "ecc="));
  return 0;
}

int nvmlDeviceGetRemappedRows(void* device, unsigned int* corrected, unsigned int* uncorrected,
                              unsigned int* pending, unsigned int* failed) {
  if (Ordinal(device) < 0) return 2;
  const std::string faults = FaultsOnceAnswered(device);
  if (faults.find("lost ") != std::string::npos) return 15;
  *corrected = 0;
  *uncorrected = faults.find("remap=") != std::string::npos ? 1 : 0;
  *pending = faults.find("remap=pending") != std::string::npos ? 1 : 0;
  *failed = faults.find("remap=failed") != std::string::npos ? 1 : 0;
  return 0;
}

// NVML_FEATURE_ENABLED (1) for an active link, DISABLED (0) for one listed as down;
// INVALID_ARGUMENT past the links the GPU has, NOT_SUPPORTED without NVLink (3).
int nvmlDeviceGetNvLinkState(void* device, unsigned int link, int* is_active) {
  if (Ordinal(device) < 0 || is_active == nullptr) return 2;
  const std::string faults = FaultsOnceAnswered(device);
  if (faults.find("lost ") != std::string::npos) return 15;
  const long long links = Value(faults, "nvlinks=");
  if (links == 0) return 3;
  if (static_cast<long long>(link) >= links) return 2;
  *is_active = 1;
  for (long long down : Values(faults, "down=")) {
    if (down == static_cast<long long>(link)) *is_active = 0;
  }
  return 0;
}

}  // extern "C"
