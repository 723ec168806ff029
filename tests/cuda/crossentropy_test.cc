// The CUDA table's cross-entropy (kernels/cuda/crossentropy.cu) against the CPU's: over
// vocabulary slices, and forward and backward in one pass over the logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cuda/cuda_ops_fixture.h"

namespace drover::engine {
namespace {

// The halves of the vocabulary-split cross-entropy (ops.h) on one slice of the logits: its
// targets partly -1 (other slices'), fully live and with a padding tail, in fp32 and with
// bf16 operand buffers; the combine of three slices' parts; the backward with -1 targets.
TEST_F(CudaOpsTest, CrossEntropyOverVocabularySlices) {
  const int N = 37, Vl = 96;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (int live : {96, 41, 0}) {
      const std::string name =
          std::string(" ") + PrecisionName(p) + " live " + std::to_string(live);
      std::vector<float> logits = Random(static_cast<size_t>(N) * Vl, 4.0f);
      cpu_->Round(logits.data(), logits.size(), p);
      std::vector<int32_t> targets(N);
      for (int32_t& t : targets) {
        t = live > 0 && rng_() % 2 == 0 ? static_cast<int32_t>(rng_() % live) : -1;
      }
      std::vector<float> lse(N), tl(N);
      float *glogits = DevOperand(logits, p), *glse = Dev(lse), *gtl = Dev(tl);
      gpu_->CrossEntropyPartForward(glse, gtl, glogits, targets.data(), N, live, Vl, p);
      cpu_->CrossEntropyPartForward(lse.data(), tl.data(), logits.data(), targets.data(), N, live,
                                    Vl, p);
      ExpectClose(Host(gtl, N), tl, "target logits" + name, 0, 0);
      const std::vector<float> got_lse = Host(glse, N);
      if (live == 0) {
        for (int n = 0; n < N; ++n) EXPECT_EQ(got_lse[n], -INFINITY) << name;
      } else {
        ExpectClose(got_lse, lse, "slice lse" + name);
      }
      // A combined lse a little above the slice's, as when other slices add to it.
      std::vector<float> combined(N);
      for (int n = 0; n < N; ++n) combined[n] = (live > 0 ? lse[n] : 0.0f) + 0.5f;
      std::vector<float> dlogits(logits.size());
      float* gd = NewOperand(logits.size(), p);
      gpu_->CrossEntropyBackward(gd, glogits, Dev(combined), targets.data(), 0.5f / N, N, live, Vl,
                                 p);
      cpu_->CrossEntropyBackward(dlogits.data(), logits.data(), combined.data(), targets.data(),
                                 0.5f / N, N, live, Vl, p);
      ExpectClose(HostOperand(gd, logits.size(), p), dlogits, "slice dlogits" + name,
                  std::max(StoreTolerance(p), 1e-4), 1e-7);
    }
  }
  const int parts = 3;
  std::vector<float> lse_parts = Random(static_cast<size_t>(parts) * N, 6.0f);
  for (int n = 0; n < N; n += 4) lse_parts[2 * N + n] = -INFINITY;  // a slice of padding only
  const std::vector<float> tl = Random(N, 3.0f);
  std::vector<float> losses(N), lse(N);
  float *glosses = Dev(losses), *glse = Dev(lse);
  const float gmean = gpu_->CrossEntropyCombine(glosses, glse, Dev(lse_parts), Dev(tl), parts, N);
  const float cmean =
      cpu_->CrossEntropyCombine(losses.data(), lse.data(), lse_parts.data(), tl.data(), parts, N);
  EXPECT_NEAR(gmean, cmean, 1e-5 * std::fabs(cmean));
  ExpectClose(Host(glse, N), lse, "combined lse");
  ExpectClose(Host(glosses, N), losses, "combined losses");
}

// Operand buffers (ops.h) hold bf16 / fp16 themselves in mixed precision, half the memory of
// floats, unless DROVER_CUDA_GEMM_INPUTS=fp32 (the ...MatmulOnFp32Inputs entry) keeps floats.
// The forward and backward at once, in place as the model runs it, against the CPU's two
// calls: the one-pass kernel on 16-bit logits whose rows fit in shared memory (V < Vp, the
// last word partly padding; V = Vp; GPT-2's vocabulary, where each thread's running max
// moves), and the two kernels where it does not apply (Vp = 61: rows not 16-byte aligned;
// Vp = 120000: 240 KB, past a block's shared memory; fp32).
TEST_F(CudaOpsTest, CrossEntropyForwardAndBackwardInOnePass) {
  struct Shape {
    int N, V, Vp;
    float scale;
  };
  for (Precision p : {Precision::kBf16, Precision::kFp16, Precision::kFp32}) {
    for (const Shape& shape :
         {Shape{33, 50, 64, 2.0f}, Shape{9, 45, 48, 2.0f}, Shape{3, 50257, 50304, 8.0f},
          Shape{7, 45, 61, 2.0f}, Shape{2, 119993, 120000, 4.0f}}) {
      const int N = shape.N, V = shape.V, Vp = shape.Vp;
      const std::string name =
          " V=" + std::to_string(V) + " Vp=" + std::to_string(Vp) + " " + PrecisionName(p);
      std::vector<float> logits = RandomLogits(N, Vp, shape.scale, p);
      std::vector<int32_t> targets = RandomTargets(N, V);
      targets[0] = V - 1;  // the last live column, in the last live word
      std::vector<float> losses(N), lse(N);
      float *glogits = DevOperand(logits, p), *glosses = Dev(losses), *glse = Dev(lse);
      const float dloss = 0.25f / N;
      const float gmean = gpu_->CrossEntropyForwardBackward(glogits, glosses, glse, glogits,
                                                            targets.data(), dloss, N, V, Vp, p);
      const float cmean = cpu_->CrossEntropyForward(losses.data(), lse.data(), logits.data(),
                                                    targets.data(), N, V, Vp, p);
      cpu_->CrossEntropyBackward(logits.data(), logits.data(), lse.data(), targets.data(), dloss, N,
                                 V, Vp, p);
      EXPECT_NEAR(gmean, cmean, 1e-5 * cmean) << name;
      ExpectClose(Host(glosses, N), losses, "cross-entropy losses" + name);
      ExpectClose(Host(glse, N), lse, "cross-entropy lse" + name);
      ExpectStoredIn(HostOperand(glogits, logits.size(), p), p, "dlogits" + name);
      ExpectClose(HostOperand(glogits, logits.size(), p), logits, "dlogits" + name,
                  std::max(StoreTolerance(p), 1e-4), 1e-7);
    }
  }
}

}  // namespace
}  // namespace drover::engine
