// cli/device_flags.h: --device and --precision of drover eval and drover sample.
#include "cli/device_flags.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <vector>

namespace drover::cli {
namespace {

// Parses `args` (after the program name) into flags; false when CLI11 refuses them.
bool Parse(std::vector<std::string> args, DeviceFlags* flags, bool with_precision = true) {
  CLI::App app;
  AddDeviceOptions(&app, flags, with_precision);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError&) {
    return false;
  }
  return true;
}

TEST(DeviceFlagsTest, TheCpuInFp32IsTheDefaultAndOnlyKnownNamesAreTaken) {
  DeviceFlags f;
  ASSERT_TRUE(Parse({}, &f));
  EXPECT_EQ(OpsFor(f).value(), engine::CpuOps());
  EXPECT_EQ(PrecisionOf(f), engine::Precision::kFp32);
  ASSERT_TRUE(Parse({"--precision", "bf16"}, &f));
  EXPECT_EQ(PrecisionOf(f), engine::Precision::kBf16);
  DeviceFlags bad;
  EXPECT_FALSE(Parse({"--device", "tpu"}, &bad));
  EXPECT_FALSE(Parse({"--precision", "fp8"}, &bad));
  EXPECT_FALSE(Parse({"--precision", "bf16"}, &bad, /*with_precision=*/false));  // drover sample
}

// Where the CUDA table cannot be made (this build's plugin finds no GPU, or there is no plugin),
// the reason names the flag the user typed, not a job spec's key; there is no fallback.
TEST(DeviceFlagsTest, ADeviceThatCannotRunSaysWhyNamingTheFlag) {
  DeviceFlags f;
  ASSERT_TRUE(Parse({"--device", "cuda"}, &f));
  auto ops = OpsFor(f);
  if (ops.ok()) GTEST_SKIP() << "this machine runs CUDA";
  EXPECT_EQ(ops.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ops.status().message().rfind("--device cuda: ", 0), 0u) << ops.status();
  EXPECT_EQ(ops.status().message().find("resources.device"), std::string::npos) << ops.status();
}

}  // namespace
}  // namespace drover::cli
