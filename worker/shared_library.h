// A shared library opened at run time (dlopen) and closed with its owner: how the agent
// reaches the NVIDIA driver and NVML without linking them (gpu_probe.h, gpu_health.h).
#pragma once

#include <dlfcn.h>

#include <string>

namespace drover {

class SharedLibrary {
 public:
  explicit SharedLibrary(const std::string& name)
      : handle_(::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    if (handle_ == nullptr) {
      const char* why = ::dlerror();
      error_ = why != nullptr ? why : "unknown error";
    }
  }
  ~SharedLibrary() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  bool ok() const { return handle_ != nullptr; }
  // dlerror()'s words when the library could not be opened.
  const std::string& error() const { return error_; }
  // The entry point `symbol` as a `Fn`, or nullptr when the library lacks it.
  template <typename Fn>
  Fn Get(const char* symbol) const {
    return reinterpret_cast<Fn>(::dlsym(handle_, symbol));
  }

 private:
  void* handle_;
  std::string error_;
};

}  // namespace drover
