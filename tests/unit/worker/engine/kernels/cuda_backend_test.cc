#include "worker/engine/kernels/cuda_backend.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace drover::engine {
namespace {

// Where the build made the CUDA plugin (next to this test, as next to the programs), it
// must load with every symbol resolved (dlopen RTLD_NOW) and its entry point must run: on
// a machine without a GPU it then reports that, in its own words. A plugin that references
// a symbol only the programs define fails here, on every commit, rather than on the first
// GPU machine it meets.
TEST(CudaBackendTest, ThePluginBuiltHereLoadsAndItsEntryPointRuns) {
  const std::filesystem::path plugin =
      std::filesystem::path(DROVER_BIN_DIR) / "bin" / kCudaPluginName;
  StatusOr<Ops*> ops = CudaOps();
  if (!std::filesystem::exists(plugin)) {
    ASSERT_FALSE(ops.ok());
    EXPECT_NE(ops.status().message().find("cannot load the CUDA backend"), std::string::npos)
        << ops.status();
    GTEST_SKIP() << "this build has no CUDA plugin (nvcc was not found)";
  }
  if (ops.ok()) {
    EXPECT_STREQ((*ops)->name(), "cuda");
    return;
  }
  const std::string message(ops.status().message());
  EXPECT_EQ(message.find("cannot load the CUDA backend"), std::string::npos) << message;
  EXPECT_EQ(message.find("has no"), std::string::npos) << message;
  EXPECT_EQ(message.find("ABI"), std::string::npos) << message;
  EXPECT_NE(message.find("no usable GPU"), std::string::npos) << message;
  // Where no driver library can be loaded (this machine and CI's), the runtime's own words
  // ("CUDA driver version is insufficient") would send a user to update a driver there is
  // not: the message says there is none.
  if (void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); driver != nullptr) {
    dlclose(driver);
  } else {
    EXPECT_NE(message.find("no NVIDIA driver is installed on this machine"), std::string::npos)
        << message;
  }
}

}  // namespace
}  // namespace drover::engine
