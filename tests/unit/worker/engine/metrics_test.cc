// metrics.jsonl lines (metrics.h): the fields every line has, and those only some have.
#include "worker/engine/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace drover::engine {
namespace {

TEST(StepMetricsToJsonTest, Fp16StepsCarryTheirLossScaleAndSkips) {
  StepMetrics m;
  m.step = 7;
  m.loss = 3.5;
  const std::string plain = StepMetricsToJson(m);
  EXPECT_EQ(plain.find("loss_scale"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("skipped"), std::string::npos) << plain;
  EXPECT_NE(plain.find("\"step\":7"), std::string::npos) << plain;

  m.loss_scale = 32768;
  m.skipped = true;
  m.grad_norm = std::numeric_limits<double>::infinity();  // an overflowed step's norm
  const std::string fp16 = StepMetricsToJson(m);
  EXPECT_NE(fp16.find("\"loss_scale\":32768"), std::string::npos) << fp16;
  EXPECT_NE(fp16.find("\"skipped\":true"), std::string::npos) << fp16;
  EXPECT_NE(fp16.find("\"grad_norm\":null"), std::string::npos) << fp16;
  EXPECT_EQ(fp16.back(), '}');
}

TEST(StepMetricsToJsonTest, StepsCarryTheirMfuWhereThePeakIsKnown) {
  StepMetrics m;
  m.step = 2;
  EXPECT_EQ(StepMetricsToJson(m).find("mfu"), std::string::npos);
  m.mfu = 0.4812;
  EXPECT_NE(StepMetricsToJson(m).find("\"mfu\":0.4812"), std::string::npos);
}

TEST(StepMetricsToJsonTest, DeviceStepsCarryTheirDeviceAllocations) {
  StepMetrics m;
  m.step = 3;
  EXPECT_EQ(StepMetricsToJson(m).find("device_allocations"), std::string::npos);
  m.device_allocations = 0;  // a device step that allocated nothing says so
  EXPECT_NE(StepMetricsToJson(m).find("\"device_allocations\":0"), std::string::npos);
  EXPECT_EQ(StepMetricsToJson(m).find("device_mib"), std::string::npos);
  m.device_mib = 1536;
  m.device_peak_mib = 2048.5;
  const std::string line = StepMetricsToJson(m);
  EXPECT_NE(line.find("\"device_mib\":1536"), std::string::npos) << line;
  EXPECT_NE(line.find("\"device_peak_mib\":2048.5"), std::string::npos) << line;
}

}  // namespace
}  // namespace drover::engine
