#include "worker/engine/kernels/cuda_backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace drover::engine {
namespace {

std::string ProgramDir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

StatusOr<void*> Open() {
  void* handle = nullptr;
  std::string errors;
  const std::string dir = ProgramDir();
  for (const std::string& path : {dir + "/" + kCudaPluginName, dir + "/../lib/" + kCudaPluginName,
                                  std::string(kCudaPluginName)}) {
    if (path.front() == '/' && !std::filesystem::exists(path)) continue;
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char* e = dlerror();
    errors += "\n  " + path + ": " + (e != nullptr ? e : "unknown error");
  }
  if (handle == nullptr) {
    return FailedPreconditionError(
        "cannot load the CUDA backend (" + std::string(kCudaPluginName) +
        ", built only where nvcc was found, needs libcudart, libcublas and, where built with it, "
        "libnccl)" +
        (errors.empty() ? std::string(": not found next to the program or on the library path")
                        : ":" + errors));
  }
  return handle;  // stays open until exit: the table lives that long
}

// The plugin, opened once per process.
StatusOr<void*> Handle() {
  static std::once_flag once;
  static StatusOr<void*>* opened = nullptr;
  std::call_once(once, [] { opened = new StatusOr<void*>(Open()); });
  return *opened;
}

std::atomic<bool> g_device_failed{false};

StatusOr<Ops*> Load() {
  ASSIGN_OR_RETURN(void* symbol, CudaPluginSymbol(kCreateCudaOpsSymbol));
  auto create = reinterpret_cast<CreateCudaOpsFn>(symbol);
  Ops* ops = nullptr;
  char error[1024] = {0};
  const int rc = create(kCudaOpsAbi, &ops, error, sizeof(error));
  if (rc != 0 || ops == nullptr) {
    g_device_failed = rc == kCreateDeviceFault;
    return FailedPreconditionError(error);
  }
  return ops;
}

}  // namespace

StatusOr<void*> CudaPluginSymbol(const char* symbol) {
  ASSIGN_OR_RETURN(void* handle, Handle());
  void* found = dlsym(handle, symbol);
  if (found == nullptr) {
    return FailedPreconditionError(std::string(kCudaPluginName) + " has no " + symbol +
                                   " (rebuild it with this program)");
  }
  return found;
}

StatusOr<Ops*> CudaOps() {
  static std::once_flag once;
  static StatusOr<Ops*>* loaded = nullptr;
  std::call_once(once, [] { loaded = new StatusOr<Ops*>(Load()); });
  return *loaded;
}

bool CudaDeviceFailed() { return g_device_failed; }

}  // namespace drover::engine
