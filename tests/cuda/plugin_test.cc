// Making the CUDA kernel table (the plugin's drover_create_cuda_ops): what stops it, each with
// a message that says what to change. Each case needs the process's first table to fail, so
// each runs in a process of its own, from a ctest entry that sets its environment (tests/
// CMakeLists.txt); without that environment a case has nothing to check and skips.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "worker/engine/kernels/cuda_backend.h"

namespace drover::engine {
namespace {

// The message of the first table's failure; skips unless `variable` is `value` and the plugin
// can be opened.
std::string TableFailure(const char* variable, const char* value) {
  const char* set = std::getenv(variable);
  if (set == nullptr || std::string(set) != value) return "";
  if (!CudaPluginSymbol(kCreateCudaOpsSymbol).ok()) return "";
  const StatusOr<Ops*> ops = CudaOps();
  return ops.ok() ? "the table was made" : ops.status().ToString();
}

// DROVER_CUDA_ATTENTION_TILES, when malformed, stops the table with a message that names the
// variable, the pair and what is allowed (a misspelt tile choice must not time the defaults
// unnoticed). The ctest entry Emulated.CudaBackend.MalformedAttentionTilesAreRefusedByName
// runs it with "forward=16x64,dq=4"; without such a value it has nothing to check.
TEST(CudaBackendTest, MalformedAttentionTilesAreRefusedByName) {
  const std::string message = TableFailure("DROVER_CUDA_ATTENTION_TILES", "forward=16x64,dq=4");
  if (message.empty()) GTEST_SKIP() << "run with DROVER_CUDA_ATTENTION_TILES=forward=16x64,dq=4";
  EXPECT_NE(message.find("DROVER_CUDA_ATTENTION_TILES"), std::string::npos) << message;
  EXPECT_NE(message.find("\"dq=4\" is not one of"), std::string::npos) << message;
  EXPECT_NE(message.find("dq=2|3"), std::string::npos) << message;
}

// DROVER_CUDA_ATTENTION names the attention kernels to start from; a value it does not know
// stops the table, naming the value and the choices (a misspelt "cudnn" must not time the
// default kernels unnoticed). Run with "cudnnn" by Emulated.CudaBackend.UnknownAttention*.
TEST(CudaBackendTest, UnknownAttentionKernelsAreRefusedByName) {
  const std::string message = TableFailure("DROVER_CUDA_ATTENTION", "cudnnn");
  if (message.empty()) GTEST_SKIP() << "run with DROVER_CUDA_ATTENTION=cudnnn";
  EXPECT_NE(message.find("DROVER_CUDA_ATTENTION: \"cudnnn\" is not one of mma (the default), "
                         "wmma, gemms, cudnn, auto"),
            std::string::npos)
      << message;
}

// DROVER_CUDA_ATTENTION=cudnn with a cuDNN the table cannot use stops the table, rather than
// failing at the first attention or quietly taking the table's own kernels: one that cannot be
// opened (the message names the library and DROVER_CUDNN_LIBRARY), or one older than 9.0 (the
// emulator's cuDNN with DROVER_EMU_CUDNN_VERSION=8907). The ctest entries
// Emulated.CudaBackend.ACudnnTheTableCannotUse* run it so.
TEST(CudaBackendTest, ACudnnTheTableCannotUseIsRefusedByName) {
  const char* library = std::getenv("DROVER_CUDNN_LIBRARY");
  const char* version = std::getenv("DROVER_EMU_CUDNN_VERSION");
  const bool missing =
      library != nullptr && std::string(library).find("no-such") != std::string::npos;
  const std::string message =
      missing || version != nullptr ? TableFailure("DROVER_CUDA_ATTENTION", "cudnn") : "";
  if (message.empty()) {
    GTEST_SKIP() << "run with DROVER_CUDA_ATTENTION=cudnn and DROVER_CUDNN_LIBRARY=/no-such-"
                    "libcudnn, or the emulator's cuDNN with DROVER_EMU_CUDNN_VERSION=8907";
  }
  if (missing) {
    EXPECT_NE(message.find("DROVER_CUDA_ATTENTION=cudnn: cannot open " + std::string(library)),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("install cuDNN 9, or name its libcudnn.so.9 in DROVER_CUDNN_LIBRARY"),
              std::string::npos)
        << message;
  } else {
    EXPECT_NE(message.find("DROVER_CUDA_ATTENTION=cudnn: cuDNN " + std::string(version) +
                           " is older than 9.0"),
              std::string::npos)
        << message;
  }
}

// DROVER_CUDA_ATTENTION=auto with a cuDNN the table cannot use (one that cannot be opened, or
// one older than 9.0) still makes the table, whose own kernels then take every attention. The
// ctest entries Emulated.CudaBackend.AutoAttentionWithoutAUsableCudnn* run it so.
TEST(CudaBackendTest, AutoAttentionWithoutAUsableCudnnMakesTheTable) {
  const std::string message = TableFailure("DROVER_CUDA_ATTENTION", "auto");
  if (message.empty()) GTEST_SKIP() << "run with DROVER_CUDA_ATTENTION=auto";
  EXPECT_EQ(message, "the table was made");
}

// A GPU this build's kernels were not compiled for (the emulator's DROVER_EMU_NO_KERNEL_IMAGE
// and DROVER_EMU_COMPUTE_CAPABILITY=80 stand in for an A100 under the default sm_90 build)
// stops the table at once, with the build's architectures, the GPU's compute capability and
// the cmake setting to rebuild with; it failed at the first kernel of the first step before.
// A GPU older than the kernels allow (70: a V100) is told so instead of how to rebuild.
TEST(CudaBackendTest, AGpuTheBuildCannotRunIsRefusedWithWhatToRebuild) {
  const std::string message = TableFailure("DROVER_EMU_NO_KERNEL_IMAGE", "1");
  if (message.empty())
    GTEST_SKIP() << "run on the kernel emulator with DROVER_EMU_NO_KERNEL_IMAGE=1";
  const char* capability = std::getenv("DROVER_EMU_COMPUTE_CAPABILITY");
  const std::string cc = capability != nullptr ? capability : "90";
  EXPECT_NE(message.find("unusable GPU"), std::string::npos) << message;
  EXPECT_NE(message.find("CMAKE_CUDA_ARCHITECTURES=90"), std::string::npos) << message;
  EXPECT_NE(message.find("compute capability " + cc.substr(0, 1) + "." + cc.substr(1)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("no kernel image is available"), std::string::npos) << message;
  if (std::stoi(cc) >= 80) {
    EXPECT_NE(message.find("-DCMAKE_CUDA_ARCHITECTURES=" + cc), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("need compute capability 8.0 or newer"), std::string::npos) << message;
    EXPECT_EQ(message.find("rebuild"), std::string::npos) << message;
  }
  // The build's fault, not the GPU's: no slot is to be cordoned for it.
  EXPECT_FALSE(CudaDeviceFailed());
}

// A machine whose driver cannot serve this build stops the table with what to change, not
// the runtime's "CUDA driver version is insufficient for CUDA runtime version", which is
// also what a machine with no driver at all gets: the emulator's DROVER_EMU_DRIVER_VERSION=0
// stands in for one without a driver, 11040 for one whose driver supports CUDA 11.4 under
// this 12.8 runtime. Run so by Emulated.CudaBackend.AMachineWhoseDriverCannotServeTheBuild_*.
TEST(CudaBackendTest, AMachineWhoseDriverCannotServeTheBuildIsToldWhatToChange) {
  const char* version = std::getenv("DROVER_EMU_DRIVER_VERSION");
  const std::string message =
      version != nullptr ? TableFailure("DROVER_EMU_DRIVER_VERSION", version) : "";
  if (message.empty()) GTEST_SKIP() << "run on the kernel emulator with DROVER_EMU_DRIVER_VERSION";
  EXPECT_NE(message.find("no usable GPU: "), std::string::npos) << message;
  if (std::string(version) == "0") {
    EXPECT_NE(message.find("no NVIDIA driver is installed on this machine"), std::string::npos)
        << message;
    EXPECT_NE(message.find("CPU jobs run without it"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("the NVIDIA driver supports CUDA 11.4 and this build's CUDA runtime "
                           "is 12.8: update the driver"),
              std::string::npos)
        << message;
  }
  // The node's fault, not the job's (IsDeviceFault): under an agent its slot is cordoned and
  // the job goes elsewhere.
  EXPECT_TRUE(CudaDeviceFailed());
}

// A GPU that has failed before the table is made (the emulator's DROVER_EMU_GPU_FAULT, set to
// fail device 0 at once: the trigger file is /) stops the table with the error, and says that
// the GPU is at fault (CudaDeviceFailed), so that a trainer under an agent exits with
// kExitDeviceFault and the coordinator cordons its slot. Run so by
// Emulated.CudaBackend.AGpuThatFailedIsTheSlotsFault.
TEST(CudaBackendTest, AGpuThatFailedBeforeTheTableIsMadeIsTheSlotsFault) {
  const std::string message = TableFailure("DROVER_EMU_GPU_FAULT", "0@/");
  if (message.empty()) GTEST_SKIP() << "run on the kernel emulator with DROVER_EMU_GPU_FAULT=0@/";
  EXPECT_NE(message.find("unusable GPU: the GPU failed: cudaErrorECCUncorrectable"),
            std::string::npos)
      << message;
  EXPECT_TRUE(CudaDeviceFailed());
}

}  // namespace
}  // namespace drover::engine
