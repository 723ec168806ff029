// A stand-in for the NVIDIA driver library (libcuda.so.1) with the entry points the agent's GPU
// probe calls (worker/gpu_probe.cc), so that the probe's success path is tested where no GPU
// is: the devices are DROVER_FAKE_GPUS, "name,GiB,compute capability" entries separated by
// ';' (e.g. "NVIDIA H200,141,90;Tesla V100-SXM2-16GB,16,70"), read at each call. Errors are
// the driver's codes (cuda.h): CUDA_ERROR_NO_DEVICE (100) with no devices, INVALID_DEVICE
// (101) for an ordinal past them, INVALID_VALUE (1) otherwise.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Device {
  std::string name;
  long long gib = 0;
  int capability = 0;
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
      devices.push_back(d);
    }
  }
  return devices;
}

bool Valid(int device) { return device >= 0 && device < static_cast<int>(Devices().size()); }

}  // namespace

extern "C" {

int cuInit(unsigned int) { return Devices().empty() ? 100 : 0; }

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

int cuGetErrorName(int error, const char** name) {
  *name = error == 100   ? "CUDA_ERROR_NO_DEVICE"
          : error == 101 ? "CUDA_ERROR_INVALID_DEVICE"
                         : "CUDA_ERROR_INVALID_VALUE";
  return 0;
}

}  // extern "C"
