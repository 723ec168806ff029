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

// The fused MLP ops reach the wrapped table as themselves, so that a CUDA profile times its
// fused GEMMs rather than the unfused ops the base class would run through this wrapper.
TEST(ProfiledOpsTest, PassesTheFusedMlpOpsThroughWhole) {
  ProfiledOps ops(CpuOps());
  const int N = 6, C = 8, OC = 12;
  std::mt19937 rng(2);
  std::normal_distribution<float> dist;
  std::vector<float> inp(N * C), w(OC * C), b(OC), dout(N * C);
  for (auto* v : {&inp, &w, &b, &dout}) {
    for (float& x : *v) x = dist(rng);
  }
  std::vector<float> pre(N * OC), out(N * OC), want_pre(N * OC), want_out(N * OC);
  CpuOps()->MatmulGeluForward(want_out.data(), want_pre.data(), inp.data(), w.data(), b.data(), N,
                              C, OC, Precision::kFp32);
  ops.MatmulGeluForward(out.data(), pre.data(), inp.data(), w.data(), b.data(), N, C, OC,
                        Precision::kFp32);
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(pre, want_pre);
  // The backward through a projection (OC -> C) of out.
  std::vector<float> dpre(N * OC), dw(C * OC), db(C);
  ops.GeluMatmulBackward(dpre.data(), dw.data(), db.data(), dout.data(), false, out.data(),
                         w.data(), pre.data(), N, OC, C, false, Precision::kFp32);

  EXPECT_EQ(ops.totals(ProfiledOps::kMatmulGeluForward).calls, 1);
  EXPECT_EQ(ops.totals(ProfiledOps::kMatmulGeluForward).flops, 2.0 * N * C * OC);
  EXPECT_EQ(ops.totals(ProfiledOps::kGeluMatmulBackward).calls, 1);
  EXPECT_EQ(ops.totals(ProfiledOps::kGeluMatmulBackward).flops, 4.0 * N * C * OC);
  for (ProfiledOps::Op op : {ProfiledOps::kMatmulForward, ProfiledOps::kMatmulBackward,
                             ProfiledOps::kGeluForward, ProfiledOps::kGeluBackward}) {
    EXPECT_EQ(ops.totals(op).calls, 0) << "op " << op;
  }
  EXPECT_NE(ops.Report(1).find("GeluMatmulBackward"), std::string::npos);
}

}  // namespace
}  // namespace drover::engine
