// Whether the real cuDNN's engines take the fused attention graphs
// (worker/engine/kernels/cuda/cudnn_graphs.h) and compile them for an H200 (and an A100), checked
// on a machine with no GPU: since cuDNN 9.8 a device-properties descriptor describes the GPU,
// and heuristics and plans are made for the description (deviceless ahead-of-time
// compilation). The emulated cuDNN checks the graphs' arithmetic; this checks that cuDNN itself
// recognises them as flash attention, which the emulator cannot say.
//
// Where no CUDA driver is installed, the CUDA toolkit's stub libcuda.so stands in for it. cuDNN
// then compiles an engine's kernels with NVRTC and fails only to load them into the driver
// (cuLibraryLoadData: the stub answers CUDA_ERROR_STUB_LIBRARY, 34). That is the one refusal
// taken here as "this engine takes the graph"; any other (NOT_SUPPORTED_GRAPH_PATTERN, no
// engine offered) fails the test. With a GPU and its driver, the plan is made outright.
//
// Skips where cuDNN 9.8 or later, NVRTC, or the stub is not installed.
#include "worker/engine/kernels/cuda/cudnn_graphs.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>

namespace drover::engine::cuda::cudnn_graphs {
namespace {

// GPUs as cudaGetDeviceProperties describes them, in the JSON cuDNN's device-properties
// descriptor reads, with their driver's CUDA version (580: 13.0). The H200: 132
// multiprocessors, 227 KiB of shared memory a block may opt in to, 60 MB of L2, 143771 MiB (the
// GPU machine's PyTorch and nvidia-smi, /work/.library/device/KINDS.md).
constexpr char kH200[] = R"({
  "deviceName": "NVIDIA H200", "deviceVer": 900, "driverVer": 13000, "cudaDeviceId": 0,
  "multiProcessorCount": 132, "maxCtasPerSM": 32, "maxThreadsPerSM": 2048,
  "maxThreadsPerBlock": 1024, "warpSize": 32, "regsPerBlock": 65536, "maxRegistersPerSM": 65536,
  "maxSharedMemoryPerBlock": 49152, "maxSharedMemoryPerBlockOptin": 232448,
  "reservedSharedMemoryPerBlock": 1024, "l2CacheSize": 62914560,
  "totalGlobalMem": 150754820096, "smClockRateKHz": 1980000, "memClockRateKHz": 3201000,
  "maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
  "pciDeviceId": 0, "isTccDriver": 0, "supportCoopLaunch": 1})";
// An A100 80GB (sm_80): 108 multiprocessors, 163 KiB a block may opt in to, 40 MB of L2, as
// NVIDIA's A100 datasheet and CUDA programming guide give them.
constexpr char kA100[] = R"({
  "deviceName": "NVIDIA A100-SXM4-80GB", "deviceVer": 800, "driverVer": 13000,
  "cudaDeviceId": 0, "multiProcessorCount": 108, "maxCtasPerSM": 32, "maxThreadsPerSM": 2048,
  "maxThreadsPerBlock": 1024, "warpSize": 32, "regsPerBlock": 65536, "maxRegistersPerSM": 65536,
  "maxSharedMemoryPerBlock": 49152, "maxSharedMemoryPerBlockOptin": 166912,
  "reservedSharedMemoryPerBlock": 1024, "l2CacheSize": 41943040,
  "totalGlobalMem": 85198045184, "smClockRateKHz": 1410000, "memClockRateKHz": 1593000,
  "maxGridSize": [2147483647, 65535, 65535], "maxBlockSize": [1024, 1024, 64],
  "pciDeviceId": 0, "isTccDriver": 0, "supportCoopLaunch": 1})";

class CudnnGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The driver, or the toolkit's stub in its place (its soname is libcuda.so.1, so cuDNN's
    // own dlopen of that name finds the one loaded here).
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == nullptr &&
        dlopen(DROVER_CUDA_STUB_LIBCUDA, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      GTEST_SKIP() << "no CUDA driver, and no stub at " << DROVER_CUDA_STUB_LIBCUDA;
    }
    // cuDNN compiles its flash engines' kernels with NVRTC, opened by name as it needs it:
    // without one, it drops every engine before trying it, and there would be nothing to judge.
    if (dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL) == nullptr &&
        dlopen("libnvrtc.so.12", RTLD_NOW | RTLD_LOCAL) == nullptr) {
      GTEST_SKIP() << "no NVRTC (libnvrtc.so.13 or .12) on the library path";
    }
    std::string why;
    if (!LoadApi(DROVER_CUDNN_LIBRARY_PATH, &api_, &why)) GTEST_SKIP() << why;
    if (api_.GetVersion() < 90800) {
      GTEST_SKIP() << "cuDNN " << api_.GetVersion() << " describes no GPU without one (9.8 does)";
    }
  }
  void TearDown() override {
    if (device_ != nullptr) api_.DestroyDescriptor(device_);
  }

  // Makes `gpu` (a JSON description above) the GPU the plans are made for.
  void Describe(const char* gpu) {
    ASSERT_EQ(api_.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &device_),
              CUDNN_STATUS_SUCCESS);
    const std::string json = gpu;
    ASSERT_EQ(api_.SetAttribute(device_, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                json.size(), json.data()),
              CUDNN_STATUS_SUCCESS);
    const cudnnStatus_t st = api_.Finalize(device_);
    ASSERT_EQ(st, CUDNN_STATUS_SUCCESS) << "the GPU's description: " << api_.Explain(st);
  }

  // Builds `graph`'s ops for `s` and asks cuDNN for a plan for the GPU Describe gave. Empty when
  // an engine takes the graph (the plan is made, or an engine compiled its kernels and only
  // loading them failed: the stub driver, or a driver with no GPU); else every refusal.
  template <typename Graph>
  std::string Verdict(Graph graph, const Shape& s) {
    GraphBuilder g(&api_);
    graph(g, s);
    Plan plan;
    std::string why;
    if (g.Build(Target{nullptr, device_}, &plan, &why)) return "";
    for (const Refusal& r : g.refusals()) {
      if (r.status == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER &&
          r.explanation.find("cuLibraryLoadData") != std::string::npos) {
        return "";
      }
    }
    return why;
  }

  Api api_;
  cudnnBackendDescriptor_t device_ = nullptr;
};

// One shape, in one 16-bit type, on one GPU (an H200 unless named).
struct Case {
  const char* name;
  int B, T, C, NH;
  Precision precision;
  const char* gpu = kH200;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CudnnGraphsForAShapeTest : public CudnnGraphsTest,
                                 public ::testing::WithParamInterface<Case> {};

TEST_P(CudnnGraphsForAShapeTest, CudnnCompilesBothGraphsForTheGpu) {
  const Case& c = GetParam();
  ASSERT_NO_FATAL_FAILURE(Describe(c.gpu));
  const Shape s = ShapeOf(c.B, c.T, c.C, c.NH, c.precision);
  EXPECT_EQ(Verdict(ForwardGraph, s), "");
  EXPECT_EQ(Verdict(BackwardGraph, s), "");
}

// GPT-2 124M's (head size 64, 12 heads) and 350M's (64, 16) at T=1024, and the shapes the
// emulated attention tests give cuDNN (T=128 at head size 64, T=256 at 128), and GPT-2 124M on
// an A100. cuDNN compiles every config its heuristics offer (6 for a forward graph, 3 for a
// backward one here), about 3 s a shape on this machine's two cores, so fp16 only where GPT-2
// 124M trains in it.
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudnnGraphsForAShapeTest,
    ::testing::Values(Case{"Gpt2Small_Bf16", 4, 1024, 768, 12, Precision::kBf16},
                      Case{"Gpt2Small_Fp16", 4, 1024, 768, 12, Precision::kFp16},
                      Case{"Gpt2Medium_Bf16", 2, 1024, 1024, 16, Precision::kBf16},
                      Case{"T128HeadSize64_Bf16", 2, 128, 128, 2, Precision::kBf16},
                      Case{"T256HeadSize128_Bf16", 1, 256, 256, 2, Precision::kBf16},
                      Case{"Gpt2SmallOnAnA100_Bf16", 4, 1024, 768, 12, Precision::kBf16, kA100}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The judge can refuse: cuDNN's flash engines take no fp32 backward graph, so none compiles
// (without this, a check that passed everything would look the same as the one above).
TEST_F(CudnnGraphsTest, ABackwardGraphInFp32IsTakenByNoEngine) {
  ASSERT_NO_FATAL_FAILURE(Describe(kH200));
  Shape s = ShapeOf(2, 1024, 768, 12, Precision::kBf16);
  s.type = CUDNN_DATA_FLOAT;
  EXPECT_NE(Verdict(BackwardGraph, s), "");
}

}  // namespace
}  // namespace drover::engine::cuda::cudnn_graphs
