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

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>

namespace drover::engine::cuda::cudnn_graphs {
namespace {

// A GPU as cudaGetDeviceProperties describes it: what differs between the two below.
struct Gpu {
  const char* name;
  int version;  // compute capability x 100
  int multiprocessors;
  int64_t shared_optin, l2_bytes, memory_bytes;  // a block's opt-in shared memory
  int sm_khz, memory_khz;
};
// The H200: 132 multiprocessors, 227 KiB of shared memory a block may opt in to, 60 MB of L2,
// 143771 MiB (the GPU machine's PyTorch and nvidia-smi, /work/.library/device/KINDS.md).
constexpr Gpu kH200{"NVIDIA H200", 900, 132, 232448, 62914560, 150754820096, 1980000, 3201000};
// An A100 80GB (sm_80): 108 multiprocessors, 163 KiB, 40 MB of L2, as NVIDIA's A100 datasheet
// and CUDA programming guide give them.
constexpr Gpu kA100{
    "NVIDIA A100-SXM4-80GB", 800, 108, 166912, 41943040, 85198045184, 1410000, 1593000};

// `gpu` in the JSON cuDNN's device-properties descriptor reads (its fields are cudaDeviceProp's;
// cuDNN names each one missing), with the driver's CUDA version of the GPU machine (580: 13.0)
// and what every sm_80 and sm_90 part shares.
std::string Json(const Gpu& gpu) {
  std::ostringstream json;
  json << "{\"deviceName\": \"" << gpu.name << "\"";
  auto field = [&](const char* key, int64_t value) { json << ", \"" << key << "\": " << value; };
  field("deviceVer", gpu.version);
  field("driverVer", 13000);
  field("cudaDeviceId", 0);
  field("multiProcessorCount", gpu.multiprocessors);
  field("maxCtasPerSM", 32);
  field("maxThreadsPerSM", 2048);
  field("maxThreadsPerBlock", 1024);
  field("warpSize", 32);
  field("regsPerBlock", 65536);
  field("maxRegistersPerSM", 65536);
  field("maxSharedMemoryPerBlock", 49152);
  field("maxSharedMemoryPerBlockOptin", gpu.shared_optin);
  field("reservedSharedMemoryPerBlock", 1024);
  field("l2CacheSize", gpu.l2_bytes);
  field("totalGlobalMem", gpu.memory_bytes);
  field("smClockRateKHz", gpu.sm_khz);
  field("memClockRateKHz", gpu.memory_khz);
  field("pciDeviceId", 0);
  field("isTccDriver", 0);
  field("supportCoopLaunch", 1);
  json << ", \"maxGridSize\": [2147483647, 65535, 65535], \"maxBlockSize\": [1024, 1024, 64]}";
  return json.str();
}

class CudnnGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The driver, or the toolkit's stub in its place (its soname is libcuda.so.1, so cuDNN's
    // own dlopen of that name finds the one loaded here).
    // The build names the stub where it found one (DROVER_CUDA_STUB_LIBCUDA, else empty).
    const std::string stub = DROVER_CUDA_STUB_LIBCUDA;
    if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == nullptr &&
        (stub.empty() || dlopen(stub.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr)) {
      GTEST_SKIP() << "no CUDA driver, and no toolkit stub libcuda.so"
                   << (stub.empty() ? " was found at build time" : " at " + stub);
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

  // Makes `gpu` the GPU the plans are made for.
  void Describe(const Gpu& gpu) {
    ASSERT_EQ(api_.CreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &device_),
              CUDNN_STATUS_SUCCESS);
    const std::string json = Json(gpu);
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
  Gpu gpu = kH200;
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
