// The CUDA table's LayerNorm (kernels/cuda/layernorm.cu) against the CPU's: forward and
// backward in each precision, the shapes where each kernel splits, and the backward's
// column sums bit for bit on a second run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cuda/cuda_ops_fixture.h"

namespace drover::engine {
namespace {

// With the outputs stored in each precision: bf16 / fp16 outputs must be exactly values of
// it, and within one of its rounding steps of the CPU's (the fp32 values before rounding
// differ in their last bits, which may round them apart).
TEST_F(CudaOpsTest, LayerNormForwardAndBackward) {
  const int N = 300, C = 200;  // 5 blocks of the backward's 64 rows, the last one short
  const std::vector<float> x = Random(N * C, 2.0f), w = Random(C), b = Random(C);
  for (Precision store : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    const std::string name = std::string(" stored ") + PrecisionName(store);
    const double rtol = StoreTolerance(store);
    std::vector<float> out(N * C), mean(N), rstd(N);
    float *gout = NewOperand(out.size(), store), *gmean = Dev(mean), *grstd = Dev(rstd);
    float *gx = Dev(x), *gw = Dev(w);
    gpu_->LayerNormForward(gout, gmean, grstd, gx, gw, Dev(b), N, C, store);
    cpu_->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                           store);
    ExpectStoredIn(HostOperand(gout, out.size(), store), store, "layernorm out" + name);
    ExpectClose(HostOperand(gout, out.size(), store), out, "layernorm out" + name, rtol, 1e-5);
    ExpectClose(Host(grstd, N), rstd, "layernorm rstd" + name);
    // dout as a run stores it (the backward reads it so: ops.h, NarrowWritten).
    std::vector<float> dout = Random(N * C);
    cpu_->Round(dout.data(), dout.size(), store);
    // dout as floats, and as an operand buffer (16-bit in mixed precision) as a GEMM's dinp;
    // with the latter, dinp's 16-bit copy too where operand buffers are 16-bit.
    const bool sixteen = gpu_->OperandFloats(N * C, store) < static_cast<size_t>(N) * C;
    for (bool accumulate : {false, true}) {
      for (bool operand : {false, true}) {
        std::vector<float> dinp = Random(N * C), dw = Random(C), db = Random(C);
        float *gdinp = Dev(dinp), *gdw = Dev(dw), *gdb = Dev(db);
        float *gdout = operand ? DevOperand(dout, store) : Dev(dout);
        float *gcopy = operand && sixteen ? NewOperand(dinp.size(), store) : nullptr;
        gpu_->LayerNormBackward(gdinp, gcopy, gdw, gdb, gdout, operand, gx, gw, gmean, grstd, N, C,
                                accumulate, store);
        cpu_->LayerNormBackward(dinp.data(), nullptr, dw.data(), db.data(), dout.data(), operand,
                                x.data(), w.data(), mean.data(), rstd.data(), N, C, accumulate,
                                store);
        const std::string a =
            (accumulate ? " (accumulate)" : "") + std::string(operand ? " (operand)" : "") + name;
        if (gcopy != nullptr) {
          ExpectClose(HostOperand(gcopy, dinp.size(), store), Host(gdinp, dinp.size()),
                      "layernorm dinp's copy" + a, 0, 0);
        }
        ExpectStoredIn(Host(gdinp, dinp.size()), store, "layernorm dinp" + a);
        ExpectClose(Host(gdinp, dinp.size()), dinp, "layernorm dinp" + a, std::max(rtol, 1e-4),
                    1e-4);
        ExpectClose(Host(gdw, C), dw, "layernorm dweight" + a, 1e-4, 1e-4);
        ExpectClose(Host(gdb, C), db, "layernorm dbias" + a, 1e-4, 1e-4);
      }
    }
  }
}

// A 16-bit out takes the kernel that keeps each lane's columns in registers where C is a
// multiple of 8 up to 2048 (one to eight groups of 8 a lane, the last group of lanes short),
// else the plain one (C = 100, 2056): each must give the CPU's outputs within one rounding
// step, and values of the precision.
TEST_F(CudaOpsTest, LayerNormForwardAtEdgeShapes) {
  const int N = 37;
  for (int C : {8, 200, 256, 264, 768, 1600, 2048, 100, 2056}) {
    const std::vector<float> x = Random(N * C, 2.0f), w = Random(C), b = Random(C);
    for (Precision store : {Precision::kBf16, Precision::kFp16}) {
      const std::string name = " C=" + std::to_string(C) + " " + PrecisionName(store);
      std::vector<float> out(N * C), mean(N), rstd(N);
      float *gout = NewOperand(out.size(), store), *gmean = Dev(mean), *grstd = Dev(rstd);
      gpu_->LayerNormForward(gout, gmean, grstd, Dev(x), Dev(w), Dev(b), N, C, store);
      cpu_->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                             C, store);
      ExpectStoredIn(HostOperand(gout, out.size(), store), store, "layernorm out" + name);
      ExpectClose(HostOperand(gout, out.size(), store), out, "layernorm out" + name,
                  StoreTolerance(store), 1e-5);
      ExpectClose(Host(gmean, N), mean, "layernorm mean" + name);
      ExpectClose(Host(grstd, N), rstd, "layernorm rstd" + name);
    }
  }
}

// LayerNorm's backward (layernorm.cu: each block's warps keep dweight and dbias sums of 2 C
// floats in shared memory) where its kernel splits: C not a multiple of the 4 floats a lane
// loads, C so wide that a block has fewer than 8 warps, or that one warp's sums need more
// than the default 48 KiB (the shared memory limit raised); N not a multiple of a block's
// rows. Against the CPU, and bit for bit on a second run.
TEST_F(CudaOpsTest, LayerNormBackwardAtEdgeShapesRepeatsBitForBit) {
  struct Shape {
    int N, C;
  };
  for (const Shape &sh : {Shape{300, 202}, Shape{70, 4000}, Shape{9, 6200}}) {
    const size_t nc = static_cast<size_t>(sh.N) * sh.C;
    const std::vector<float> x = Random(nc, 2.0f), w = Random(sh.C), b = Random(sh.C);
    std::vector<float> out(nc), mean(sh.N), rstd(sh.N);
    float *gx = Dev(x), *gw = Dev(w), *gmean = Dev(mean), *grstd = Dev(rstd);
    gpu_->LayerNormForward(Dev(out), gmean, grstd, gx, gw, Dev(b), sh.N, sh.C, Precision::kFp32);
    cpu_->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), sh.N,
                           sh.C, Precision::kFp32);
    for (Precision store : {Precision::kFp32, Precision::kBf16}) {
      std::vector<float> dout = Random(nc);
      cpu_->Round(dout.data(), dout.size(), store);
      // 16-bit as a GEMM writes it where the run's operand buffers are.
      const bool operand = store != Precision::kFp32;
      const float *gdout = operand ? DevOperand(dout, store) : Dev(dout);
      for (bool accumulate : {false, true}) {
        const std::string what = "layernorm N=" + std::to_string(sh.N) +
                                 " C=" + std::to_string(sh.C) +
                                 (accumulate ? " (accumulate) " : " ") + PrecisionName(store);
        const std::vector<float> dinp0 = Random(nc), dw0 = Random(sh.C), db0 = Random(sh.C);
        std::vector<std::vector<float>> got;
        for (int run = 0; run < 2; ++run) {
          float *gdinp = Dev(dinp0), *gdw = Dev(dw0), *gdb = Dev(db0);
          // dinp's 16-bit copy as well where operand buffers are 16-bit.
          float *gcopy =
              operand && gpu_->OperandFloats(nc, store) < nc ? NewOperand(nc, store) : nullptr;
          gpu_->LayerNormBackward(gdinp, gcopy, gdw, gdb, gdout, operand, gx, gw, gmean, grstd,
                                  sh.N, sh.C, accumulate, store);
          if (gcopy != nullptr) {
            ExpectClose(HostOperand(gcopy, nc, store), Host(gdinp, nc), what + " dinp's copy", 0,
                        0);
          }
          std::vector<float> dw = Host(gdw, sh.C), db = Host(gdb, sh.C);
          dw.insert(dw.end(), db.begin(), db.end());
          got.push_back(dw);
          if (run == 0) {
            std::vector<float> dinp = dinp0, cdw = dw0, cdb = db0;
            cpu_->LayerNormBackward(dinp.data(), nullptr, cdw.data(), cdb.data(), dout.data(),
                                    operand, x.data(), w.data(), mean.data(), rstd.data(), sh.N,
                                    sh.C, accumulate, store);
            ExpectClose(Host(gdinp, nc), dinp, what + " dinp",
                        std::max(StoreTolerance(store), 1e-4), 1e-4);
            ExpectClose(Host(gdw, sh.C), cdw, what + " dweight", 1e-4, 1e-4);
            ExpectClose(Host(gdb, sh.C), cdb, what + " dbias", 1e-4, 1e-4);
          }
        }
        for (size_t i = 0; i < got[0].size(); ++i) {
          ASSERT_EQ(Bits(got[1][i]), Bits(got[0][i])) << what << " parameter gradient " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace drover::engine
