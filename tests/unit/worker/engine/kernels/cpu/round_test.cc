// Narrowing to bf16 and fp16 (kernels/cpu/round.h): round to nearest, ties to even, with
// the overflow, underflow and NaN behaviour of a store to the narrow type.
#include "worker/engine/kernels/cpu/round.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "worker/engine/kernels/ops.h"

namespace drover::engine {
namespace {

float Bf16(float x) {
  cpu::RoundToBf16(&x, 1);
  return x;
}
float Fp16(float x) {
  cpu::RoundToFp16(&x, 1);
  return x;
}

TEST(RoundTest, Bf16KeepsEightSignificantBitsTiesToEven) {
  EXPECT_EQ(Bf16(1.0f), 1.0f);
  EXPECT_EQ(Bf16(1.0f + 0x1p-7f), 1.0f + 0x1p-7f);             // representable
  EXPECT_EQ(Bf16(1.0f + 0x1p-8f), 1.0f);                       // tie: to the even 1.0
  EXPECT_EQ(Bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);         // tie: to the even neighbour above
  EXPECT_EQ(Bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // past the tie: up
  EXPECT_EQ(Bf16(-(1.0f + 0x1p-8f + 0x1p-20f)), -(1.0f + 0x1p-7f));
  EXPECT_EQ(Bf16(3.14159265f), 3.140625f);
  EXPECT_NEAR(Bf16(1e-30f), 1e-30f, 0.004e-30f) << "bf16 has fp32's range: no underflow here";
  EXPECT_TRUE(std::isinf(Bf16(std::numeric_limits<float>::max())));
  EXPECT_TRUE(std::isinf(Bf16(-std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(Bf16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(RoundTest, Fp16OverflowsToInfAndUnderflowsToSubnormalsAndZero) {
  EXPECT_EQ(Fp16(1.0f + 0x1p-10f), 1.0f + 0x1p-10f);  // representable
  EXPECT_EQ(Fp16(1.0f + 0x1p-11f), 1.0f);             // tie: to even
  EXPECT_EQ(Fp16(65504.0f), 65504.0f);                // the largest finite
  EXPECT_EQ(Fp16(65519.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(Fp16(65520.0f)));  // half an ulp past it: a store overflows
  EXPECT_EQ(Fp16(-70000.0f), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp16(0x1p-24f), 0x1p-24f);  // the smallest subnormal
  EXPECT_EQ(Fp16(0x1p-26f), 0.0f);      // a gradient this small is lost without loss scaling
  EXPECT_TRUE(std::isnan(Fp16(std::numeric_limits<float>::quiet_NaN())));
}

// The bit-level fp16 rounding against the compiler's own conversion to _Float16 (GCC has
// it on x86; the build without it skips): every 4093rd float bit pattern of both signs, and
// every pattern near the boundaries (the subnormal range's top, 65504, 65520).
TEST(RoundTest, Fp16EqualsTheCompilersConversion) {
#ifdef __FLT16_MAX__
  auto check = [](uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, 4);
    const float want = static_cast<float>(static_cast<_Float16>(x));
    const float got = Fp16(x);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << bits;
    } else {
      ASSERT_EQ(got, want) << std::hex << bits << " (" << x << ")";
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << bits;
    }
  };
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093) check(static_cast<uint32_t>(bits));
  for (uint32_t edge : {0x38800000u, 0x33000000u, 0x477fe000u, 0x477ff000u, 0x7f800000u}) {
    for (uint32_t d = 0; d < 5000; ++d) {
      check(edge - 2500 + d);
      check((edge - 2500 + d) | 0x80000000u);
    }
  }
#else
  GTEST_SKIP() << "this compiler has no _Float16 to compare with";
#endif
}

TEST(RoundTest, OpsTableRoundsWholeArraysAndLeavesFp32Alone) {
  std::vector<float> x(100000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i) * 1e-6f;
  std::vector<float> y = x;
  CpuOps()->Round(y.data(), y.size(), Precision::kFp32);
  EXPECT_EQ(y, x);
  CpuOps()->Round(y.data(), y.size(), Precision::kBf16);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], Bf16(x[i])) << i;
  y = x;
  CpuOps()->Round(y.data(), y.size(), Precision::kFp16);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], Fp16(x[i])) << i;
}

}  // namespace
}  // namespace drover::engine
