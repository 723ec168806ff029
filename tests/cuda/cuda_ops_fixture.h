// The fixture of the CUDA op tests (tests/cuda/*_test.cc but the NCCL ones): the CUDA table
// and the CPU reference, device buffers the test keeps alive, random inputs, and the
// comparisons and error models the tests share. Skips the test where the CUDA backend cannot
// load or no GPU is usable (it says why); on the kernel emulator, fails it. Tolerances: the GPU
// sums in other orders and uses its own exp/tanh, so results agree to float rounding, not bit for
// bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/kernels/cuda_backend.h"
#include "worker/engine/kernels/ops.h"

namespace drover::engine {

class CudaOpsTest : public ::testing::Test {
 protected:
  // Whether this run's GEMMs read fp32-stored inputs (DROVER_CUDA_GEMM_INPUTS=fp32, the
  // ctest entry ...EveryOpOnFp32Inputs and the device check's step 2b): then only the 16-bit
  // precisions change, since an fp32 run stages nothing either way (matmul.cu's InputsOf, the
  // table's Narrow), and a test may leave fp32 to the default run.
  static bool Fp32GemmInputs() {
    const char* inputs = std::getenv("DROVER_CUDA_GEMM_INPUTS");
    return inputs != nullptr && std::strcmp(inputs, "fp32") == 0;
  }
  void SetUp() override {
    auto ops = CudaOps();
#ifdef DROVER_CUDA_EMULATED
    // The emulator's plugin is built with this binary and needs no GPU: a table it cannot
    // make is its bug, and a skip would pass every op test unrun.
    ASSERT_TRUE(ops.ok()) << ops.status();
#else
    if (!ops.ok()) GTEST_SKIP() << ops.status();
#endif
    gpu_ = *ops;
    cpu_ = CpuOps();
  }

  std::vector<float> Random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng_);
    return v;
  }
  // n target ids in [0, V): the cross-entropy tests' labels.
  std::vector<int32_t> RandomTargets(int n, int V) {
    std::vector<int32_t> targets(n);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng_() % V);
    return targets;
  }
  // N rows of Vp random logits (normal, `scale`) holding values of p: a cross-entropy's input.
  std::vector<float> RandomLogits(int N, int Vp, float scale, Precision p) {
    std::vector<float> logits = Random(static_cast<size_t>(N) * Vp, scale);
    cpu_->Round(logits.data(), logits.size(), p);
    return logits;
  }
  // A device copy of `host`, kept alive by the test.
  float* Dev(const std::vector<float>& host) {
    buffers_.push_back(gpu_->Allocate(std::max<size_t>(host.size(), 1)));
    gpu_->FromHost(buffers_.back().data(), host.data(), host.size());
    return buffers_.back().data();
  }
  std::vector<float> Host(const float* device, size_t n) {
    std::vector<float> v(n);
    gpu_->ToHost(v.data(), device, n);
    return v;
  }
  // Operand buffers (ops.h: Ops::OperandFloats): what only GEMMs read, in the table's format.
  // A device one holding `host` (values of p), one of n elements filled with NaN, and one's
  // n elements read back as floats.
  float* DevOperand(const std::vector<float>& host, Precision p) {
    const size_t floats = gpu_->OperandFloats(host.size(), p);
    if (floats == host.size()) return Dev(host);
    std::vector<uint16_t> bits(2 * floats, 0);
    for (size_t i = 0; i < host.size(); ++i) bits[i] = Bits16(host[i], p);
    std::vector<float> packed(floats);
    std::memcpy(packed.data(), bits.data(), floats * sizeof(float));
    return Dev(packed);
  }
  float* NewOperand(size_t n, Precision p) { return DevOperand(std::vector<float>(n, NAN), p); }
  std::vector<float> HostOperand(const float* device, size_t n, Precision p) {
    const size_t floats = gpu_->OperandFloats(n, p);
    if (floats == n) return Host(device, n);
    const std::vector<float> packed = Host(device, floats);
    std::vector<uint16_t> bits(2 * floats);
    std::memcpy(bits.data(), packed.data(), floats * sizeof(float));
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = Value16(bits[i], p);
    return values;
  }
  // A value of p (bf16 or fp16, held exactly by x: NaN included) as its 16 bits, and back.
  static uint16_t Bits16(float x, Precision p) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if (p == Precision::kBf16) return static_cast<uint16_t>(u >> 16);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const float a = std::fabs(x);
    if (std::isnan(x)) return 0x7E00;
    if (std::isinf(x)) return sign | 0x7C00;
    if (a == 0.0f) return sign;
    int e = 0;
    const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    if (e - 1 >= -14) {
      return sign | static_cast<uint16_t>((e - 1 + 15) << 10) |
             static_cast<uint16_t>(std::lround((2.0f * m - 1.0f) * 1024.0f));
    }
    return sign | static_cast<uint16_t>(std::lround(std::ldexp(a, 24)));  // subnormal
  }
  static float Value16(uint16_t b, Precision p) {
    if (p == Precision::kBf16) {
      const uint32_t u = uint32_t{b} << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    const float sign = (b & 0x8000u) != 0 ? -1.0f : 1.0f;
    const int e = (b >> 10) & 0x1F, m = b & 0x3FF;
    if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
    if (e == 31) return m == 0 ? sign * INFINITY : NAN;
    return sign * std::ldexp(1.0f + m / 1024.0f, e - 15);
  }

  static uint32_t Bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  }

  // One rounding step of `store` relative to the value (fp32: the usual bound).
  static double StoreTolerance(Precision store) {
    return store == Precision::kBf16 ? 1.0 / 128 : store == Precision::kFp16 ? 1.0 / 1024 : 1e-5;
  }
  // Every element is a value of `store` (rounding it again changes nothing).
  void ExpectStoredIn(const std::vector<float>& got, Precision store, const std::string& what) {
    std::vector<float> again = got;
    cpu_->Round(again.data(), again.size(), store);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(again[i] == got[i] || (std::isnan(got[i]) && std::isnan(again[i])))
          << what << " element " << i << " is not stored in " << PrecisionName(store) << ": "
          << got[i];
    }
  }
  // |got - want| <= atol + rtol |want| (+ unit mag[i], where mag is given) everywhere; names
  // the first element that is not.
  static void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                          const std::string& what, double rtol = 1e-4, double atol = 1e-5,
                          const std::vector<double>* mag = nullptr, double unit = 0.0) {
    ASSERT_EQ(got.size(), want.size()) << what;
    if (mag != nullptr) {
      ASSERT_EQ(mag->size(), want.size()) << what;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      const double allowed =
          atol + rtol * std::fabs(double{want[i]}) + (mag != nullptr ? unit * (*mag)[i] : 0.0);
      ASSERT_LE(std::fabs(double{got[i]} - want[i]), allowed)
          << what << " element " << i << ": gpu " << got[i] << ", cpu " << want[i];
    }
  }

  // The error model of attention whose probabilities P and softmax gradients dS enter their
  // products narrowed to p (attention_mma.cu, as FlashAttention does): each is off by up to
  // half a unit in the last place of p (2^-9 relative in bf16, 2^-12 in fp16), so an output
  // may be off by that fraction of the sum of its terms' magnitudes, whatever the sum itself
  // (which cancels: a row of dS sums to 0). Backward also reads out, to form D = rowsum(dout
  // out), so out's error reaches dS = P (dP - D) as P |dD|. From the CPU's qkv, dout and P
  // (B, NH, T, T), in units of that fraction:
  //   out_i:  sum_j P_ij |v_j|                     D_i: sum_d |dout_id| out_id (its bound)
  //   dS_ij:  |P_ij (dP_ij - D_i)| + P_ij D_i      dq_i: scale sum_j dS_ij |k_j|
  //   dk_j:   scale sum_i dS_ij |q_i|              dv_j: sum_i P_ij |dout_i|
  // The unit allowed (NarrowedOperandUnit) is twice that half-unit.
  struct AttentionMagnitudes {
    std::vector<double> out, dqkv;
  };
  static AttentionMagnitudes AttentionTermMagnitudes(const std::vector<float>& qkv,
                                                     const std::vector<float>& dout,
                                                     const std::vector<float>& att, int B, int T,
                                                     int C, int NH) {
    const int HS = C / NH;
    const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
    AttentionMagnitudes m{std::vector<double>(static_cast<size_t>(B) * T * C, 0.0),
                          std::vector<double>(static_cast<size_t>(B) * T * 3 * C, 0.0)};
    std::vector<double> ds(static_cast<size_t>(T) * T);
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < NH; ++h) {
        auto at = [&](int t, int part, int d) {
          return (static_cast<size_t>(b) * T + t) * 3 * C + part * C + h * HS + d;
        };
        auto p = [&](int i, int j) {
          return double{att[((static_cast<size_t>(b) * NH + h) * T + i) * T + j]};
        };
        auto dy = [&](int t, int d) {
          return double{dout[(static_cast<size_t>(b) * T + t) * C + h * HS + d]};
        };
        auto out = [&](int t, int d) -> double& {
          return m.out[(static_cast<size_t>(b) * T + t) * C + h * HS + d];
        };
        for (int i = 0; i < T; ++i) {
          for (int j = 0; j <= i; ++j) {
            for (int d = 0; d < HS; ++d) out(i, d) += p(i, j) * std::fabs(qkv[at(j, 2, d)]);
          }
          double D = 0.0, D_mag = 0.0;
          for (int d = 0; d < HS; ++d) D_mag += std::fabs(dy(i, d)) * out(i, d);
          for (int j = 0; j <= i; ++j) {
            double dp = 0.0;
            for (int d = 0; d < HS; ++d) dp += dy(i, d) * qkv[at(j, 2, d)];
            ds[static_cast<size_t>(i) * T + j] = dp;
            D += p(i, j) * dp;
          }
          for (int j = 0; j <= i; ++j) {
            double& x = ds[static_cast<size_t>(i) * T + j];
            x = (std::fabs(p(i, j) * (x - D)) + p(i, j) * D_mag) * scale;
          }
        }
        for (int i = 0; i < T; ++i) {
          for (int j = 0; j <= i; ++j) {
            const double pij = p(i, j), dsij = ds[static_cast<size_t>(i) * T + j];
            for (int d = 0; d < HS; ++d) {
              m.dqkv[at(i, 0, d)] += dsij * std::fabs(qkv[at(j, 1, d)]);
              m.dqkv[at(j, 1, d)] += dsij * std::fabs(qkv[at(i, 0, d)]);
              m.dqkv[at(j, 2, d)] += pij * std::fabs(dy(i, d));
            }
          }
        }
      }
    }
    return m;
  }
  // Twice the half-unit in the last place of p (2^-8 for bf16, 2^-11 for fp16; 0 for fp32,
  // whose products are not narrowed).
  static double NarrowedOperandUnit(Precision p) {
    return p == Precision::kBf16 ? 1.0 / 256 : p == Precision::kFp16 ? 1.0 / 2048 : 0.0;
  }

  Ops* gpu_ = nullptr;
  Ops* cpu_ = nullptr;
  std::mt19937 rng_{7};
  std::vector<Buffer> buffers_;
};

}  // namespace drover::engine
