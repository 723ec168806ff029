#include "worker/engine/kernels/profiled_ops.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace drover::engine {
namespace {

// The profiled table computes what the table it wraps computes, and charges each op its
// calls and, for the GEMMs and attention, their FLOPs.
TEST(ProfiledOpsTest, PassesThroughAndCountsCallsAndFlops) {
  ProfiledOps ops(CpuOps());
  const int N = 6, C = 8, OC = 5;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  std::vector<float> inp(N * C), w(OC * C), want(N * OC), got(N * OC);
  for (float& x : inp) x = dist(rng);
  for (float& x : w) x = dist(rng);
  CpuOps()->MatmulForward(want.data(), false, inp.data(), w.data(), nullptr, nullptr, N, C, OC, OC,
                          Precision::kFp32);
  ops.MatmulForward(got.data(), false, inp.data(), w.data(), nullptr, nullptr, N, C, OC, OC,
                    Precision::kFp32);
  ops.MatmulForward(got.data(), false, inp.data(), w.data(), nullptr, nullptr, N, C, OC, OC,
                    Precision::kFp32);
  EXPECT_EQ(got, want);
  ops.Fill(got.data(), 0.0f, got.size());

  const ProfiledOps::Totals matmul = ops.totals(ProfiledOps::kMatmulForward);
  EXPECT_EQ(matmul.calls, 2);
  EXPECT_EQ(matmul.flops, 2 * 2.0 * N * C * OC);
  EXPECT_GT(matmul.seconds, 0);
  EXPECT_EQ(ops.totals(ProfiledOps::kFill).calls, 1);
  EXPECT_EQ(ops.totals(ProfiledOps::kFill).flops, 0);
  EXPECT_EQ(ops.totals(ProfiledOps::kAdamWUpdate).calls, 0);

  const std::string report = ops.Report(2);
  EXPECT_NE(report.find("MatmulForward"), std::string::npos) << report;
  EXPECT_NE(report.find("Fill"), std::string::npos) << report;
  EXPECT_EQ(report.find("AdamWUpdate"), std::string::npos) << "ops that never ran are left out\n"
                                                           << report;
}

}  // namespace
}  // namespace drover::engine
