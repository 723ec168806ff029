// The CUDA table's attention (the fused mma and wmma kernels, and the GEMM version) against
// the CPU's, within the error model of narrowed probabilities (CudaOpsTest::
// AttentionTermMagnitudes), and what each keeps for backward.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cuda/cuda_ops_fixture.h"

namespace drover::engine {
namespace {

// Attention in each precision, at a small shape, at GPT-2's head size with T past a few
// tiles of the fused kernels (64 rows) and not a multiple of them, at a head size of 32 on
// one whole tile and at 128 on three, and at one where B * NH * T is odd (the state's fp32 copy
// of out then starts 4 bytes past an 8-byte boundary: a vector load of it faults on a GPU).
// In bf16 and fp16 the products that read the probabilities run in TF32 (ops.h: the GEMMs and
// the wmma kernels), which rounds them to 11 significant bits, or narrowed to p (the default
// mma kernels, as FlashAttention does): hence the looser bound there, and the error model of
// AttentionTermMagnitudes.
// Mixed-precision runs take the fused kernels (attention_mma.cu), whose state is not the
// probabilities, unless DROVER_CUDA_ATTENTION says wmma (flash_attention.cu), gemms, or cudnn
// (cudnn_attention.cu, which takes the shapes whose T is a multiple of 128: the last two; the
// ctest entries ...WithTheWmmaKernels, ...WithTheGemms and ...ThroughCudnn run this test so).
TEST_F(CudaOpsTest, AttentionForwardAndBackward) {
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape& shape :
       {Shape{2, 40, 48, 3}, Shape{2, 200, 256, 4}, Shape{1, 64, 64, 2}, Shape{1, 130, 256, 2},
        Shape{1, 300, 128, 2}, Shape{1, 41, 96, 3}, Shape{2, 128, 128, 2}, Shape{1, 256, 256, 2}}) {
    const int B = shape.B, T = shape.T, C = shape.C, NH = shape.NH;
    for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
      if (Fp32GemmInputs() && p == Precision::kFp32) continue;  // the default run's
      const std::string name = std::string(" ") + PrecisionName(p) + " T=" + std::to_string(T) +
                               " HS=" + std::to_string(C / NH);
      // out and dqkv are stored in p too: a rounding step of it on top.
      const double rtol = p == Precision::kFp32 ? 1e-4 : 3e-3 + StoreTolerance(p);
      const double atol = p == Precision::kFp32 ? 1e-5 : 1e-3;
      std::vector<float> qkv = Random(B * T * 3 * C), dout = Random(B * T * C);
      cpu_->Round(qkv.data(), qkv.size(), p);
      cpu_->Round(dout.data(), dout.size(), p);
      const size_t probabilities = static_cast<size_t>(B) * NH * T * T;
      const size_t state_floats = gpu_->AttentionStateFloats(B, T, C, NH, p);
      std::vector<float> out(B * T * C), att(probabilities, NAN), state(state_floats, NAN);
      float *gout = NewOperand(out.size(), p), *gstate = Dev(state), *gqkv = DevOperand(qkv, p);
      gpu_->AttentionForward(gout, gstate, gqkv, B, T, C, NH, p);
      cpu_->AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH, p);
      if (state_floats == probabilities) {
        ExpectClose(Host(gstate, att.size()), att, "attention probabilities" + name);
      }
      const AttentionMagnitudes mag = AttentionTermMagnitudes(qkv, dout, att, B, T, C, NH);
      const double unit = NarrowedOperandUnit(p);
      ExpectStoredIn(HostOperand(gout, out.size(), p), p, "attention out" + name);
      ExpectClose(HostOperand(gout, out.size(), p), out, "attention out" + name, rtol, atol,
                  &mag.out, unit);
      std::vector<float> dqkv(qkv.size(), NAN);  // overwritten, every element
      cpu_->AttentionBackward(dqkv.data(), dout.data(), false, out.data(), att.data(), qkv.data(),
                              B, T, C, NH, p);
      // dout as floats, and as an operand buffer (16-bit in mixed precision), as the
      // projection's GEMM writes it.
      for (bool operand : {false, true}) {
        const std::string as = name + (operand ? " (operand dout)" : "");
        float* gdqkv = NewOperand(dqkv.size(), p);
        float* gdout = operand ? DevOperand(dout, p) : Dev(dout);
        gpu_->AttentionBackward(gdqkv, gdout, operand, gout, gstate, gqkv, B, T, C, NH, p);
        ExpectStoredIn(HostOperand(gdqkv, dqkv.size(), p), p, "attention dqkv" + as);
        ExpectClose(HostOperand(gdqkv, dqkv.size(), p), dqkv, "attention dqkv" + as,
                    std::max(rtol, 1e-4), std::max(atol, 1e-4), &mag.dqkv, unit);
      }
    }
  }
}

// The decoder's attention over its key/value cache (attention_decode.cu: a block per query
// and head, its warps splitting the keys) against the CPU's, in fp32: one query and several,
// at the first position and deep into a long cache (keys past a few rounds of the warps), at
// GPT-2's head size, at 128, and at sizes that leave lanes idle (48 and 16), with a cache
// longer than the rows decoded (the rows after them are not read: NaN there would show).
TEST_F(CudaOpsTest, AttentionDecodeMatchesTheCpu) {
  struct Shape {
    int from, rows, C, NH;
  };
  for (const Shape& s : {Shape{0, 1, 128, 2}, Shape{300, 1, 768, 12}, Shape{37, 5, 256, 2},
                         Shape{5, 20, 96, 2}, Shape{1023, 1, 64, 4}, Shape{9, 3, 48, 1}}) {
    const std::string name = "decode from " + std::to_string(s.from) + " rows " +
                             std::to_string(s.rows) + " HS=" + std::to_string(s.C / s.NH);
    const size_t len = static_cast<size_t>(s.from) + s.rows;
    std::vector<float> qkv = Random(len * 3 * s.C);
    std::vector<float> cache(qkv);
    cache.resize((len + 7) * 3 * s.C, NAN);  // positions past the decoded rows
    std::vector<float> want(static_cast<size_t>(s.rows) * s.C);
    cpu_->AttentionDecode(want.data(), qkv.data(), s.from, s.rows, s.C, s.NH);
    float* out = Dev(std::vector<float>(want.size(), NAN));
    gpu_->AttentionDecode(out, Dev(cache), s.from, s.rows, s.C, s.NH);
    ExpectClose(Host(out, want.size()), want, name, 1e-4, 1e-5);
  }
}

// What the fused kernels save: at GPT-2's shape the state is the row statistics (backward
// reads the forward's out), not the (T, T) probabilities (unless the GEMMs were asked for).
TEST_F(CudaOpsTest, FusedAttentionKeepsNoProbabilities) {
  const int B = 16, T = 1024, C = 768, NH = 12;
  const size_t probabilities = static_cast<size_t>(B) * NH * T * T;
  auto fused = [&](int c, int nh) {
    (void)c;
    return static_cast<size_t>(B) * nh * T;
  };
  EXPECT_EQ(gpu_->AttentionStateFloats(B, T, C, NH, Precision::kFp32), probabilities);
  const char* choice = std::getenv("DROVER_CUDA_ATTENTION");
  const std::string kernels = choice != nullptr ? choice : "";
  if (kernels == "gemms") {
    EXPECT_EQ(gpu_->AttentionStateFloats(B, T, C, NH, Precision::kBf16), probabilities);
    return;
  }
  // On a GPU that gives a block less shared memory than sm_90 (sm_86/sm_89: 101376 bytes;
  // the emulator stands in for one with DROVER_EMU_SHARED_OPTIN), a kernel that needs more
  // keeps the GEMMs: the wmma kernels from head size 64 on (107008 bytes), the mma kernels
  // (55808 bytes at head size 64) only at head size 128 (107008 bytes).
  const char* opt_in = std::getenv("DROVER_EMU_SHARED_OPTIN");
  if (opt_in != nullptr && std::atoi(opt_in) < 107008) {
    const size_t gpt2 = gpu_->AttentionStateFloats(B, T, C, NH, Precision::kBf16);
    EXPECT_EQ(gpt2, kernels == "wmma" ? probabilities : fused(C, NH));
    EXPECT_EQ(gpu_->AttentionStateFloats(B, T, 192, NH, Precision::kBf16), fused(192, NH));
    EXPECT_EQ(gpu_->AttentionStateFloats(B, T, 2 * 128, 2, Precision::kBf16), probabilities / 6);
    return;
  }
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    EXPECT_EQ(gpu_->AttentionStateFloats(B, T, C, NH, p), fused(C, NH));
    EXPECT_EQ(gpu_->AttentionStateFloats(B, T, 2 * 128, 2, p), fused(256, 2));
  }
  // A head size the fused kernels do not take (C / NH = 48) keeps the GEMMs.
  EXPECT_EQ(gpu_->AttentionStateFloats(1, 64, 96, 2, Precision::kBf16), size_t{2} * 64 * 64);
}

#ifdef DROVER_CUDA_EMULATED
// DROVER_CUDA_ATTENTION=cudnn hands cuDNN the shapes it takes (16-bit runs, T a multiple of 128)
// and only those, as the emulator's cuDNN counts its executions (tests/cuda_emu/cudnn_emu.cc):
// AttentionForwardAndBackward alone could pass with the mma kernels doing all the work.
TEST_F(CudaOpsTest, CudnnTakesTheShapesItApplies) {
  const char* choice = std::getenv("DROVER_CUDA_ATTENTION");
  const char* library = std::getenv("DROVER_CUDNN_LIBRARY");
  if (choice == nullptr || (std::string(choice) != "cudnn" && std::string(choice) != "auto") ||
      library == nullptr) {
    GTEST_SKIP() << "run with DROVER_CUDA_ATTENTION=cudnn or auto and the emulator's "
                    "DROVER_CUDNN_LIBRARY";
  }
  // Where the emulated cuDNN offers no engine, =auto leaves every shape to the table's own
  // kernels (and =cudnn stops at the first: CudnnWithoutAnEngineStopsNamingWhy).
  const uint64_t taken = std::getenv("DROVER_EMU_CUDNN_NO_ENGINE") != nullptr ? 0 : 2;
  void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr) << library << " is not the plugin this test opened";
  auto executions = reinterpret_cast<uint64_t (*)()>(dlsym(handle, "drover_emu_cudnn_executions"));
  ASSERT_NE(executions, nullptr);
  auto runs = [&](int B, int T, int C, int NH, Precision p) {
    const std::vector<float> qkv = Random(B * T * 3 * C), dout = Random(B * T * C);
    float *out = NewOperand(B * T * C, p), *dqkv = NewOperand(qkv.size(), p);
    float* state = Dev(std::vector<float>(gpu_->AttentionStateFloats(B, T, C, NH, p)));
    float *gqkv = DevOperand(qkv, p), *gdout = DevOperand(dout, p);
    const uint64_t before = executions();
    gpu_->AttentionForward(out, state, gqkv, B, T, C, NH, p);
    gpu_->AttentionBackward(dqkv, gdout, true, out, state, gqkv, B, T, C, NH, p);
    Host(out, 1);  // waits for the stream
    return executions() - before;
  };
  EXPECT_EQ(runs(1, 128, 128, 2, Precision::kBf16), taken);  // forward and backward
  EXPECT_EQ(runs(1, 128, 128, 2, Precision::kFp16), taken);
  EXPECT_EQ(runs(1, 64, 128, 2, Precision::kBf16), 0u);   // T not a multiple of 128
  EXPECT_EQ(runs(1, 128, 128, 2, Precision::kFp32), 0u);  // fp32 runs take the GEMMs
  EXPECT_EQ(runs(1, 128, 512, 2, Precision::kBf16), 0u);  // head size 256, past 128
}
#endif

}  // namespace
}  // namespace drover::engine
