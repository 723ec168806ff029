#include "worker/engine/kernels/cuda_backend.h"

#include <dlfcn.h>
#include <unistd.h>

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

StatusOr<Ops*> Load() {
  std::vector<std::string> tried;
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
        "resources.device cuda: cannot load the CUDA backend (" + std::string(kCudaPluginName) +
        ", built only where nvcc was found, needs libcudart and libcublas)" +
        (errors.empty() ? std::string(": not found next to the program or on the library path")
                        : ":" + errors));
  }
  auto create = reinterpret_cast<CreateCudaOpsFn>(dlsym(handle, kCreateCudaOpsSymbol));
  if (create == nullptr) {
    return FailedPreconditionError(std::string("resources.device cuda: ") + kCudaPluginName +
                                   " has no " + kCreateCudaOpsSymbol);
  }
  Ops* ops = nullptr;
  char error[512] = {0};
  if (create(kCudaOpsAbi, &ops, error, sizeof(error)) != 0 || ops == nullptr) {
    return FailedPreconditionError(std::string("resources.device cuda: ") + error);
  }
  return ops;  // the handle stays open: the table lives until exit
}

}  // namespace

StatusOr<Ops*> CudaOps() {
  static std::once_flag once;
  static StatusOr<Ops*>* loaded = nullptr;
  std::call_once(once, [] { loaded = new StatusOr<Ops*>(Load()); });
  return *loaded;
}

}  // namespace drover::engine
