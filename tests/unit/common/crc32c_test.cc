#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace drover::crc32c {
namespace {

TEST(Crc32cTest, StandardCheckValue) {
  EXPECT_EQ(Value("123456789"), 0xE3069283u);
  EXPECT_EQ(ExtendPortable(0, "123456789", 9), 0xE3069283u);
  if (HardwareAvailable()) {
    EXPECT_EQ(ExtendHardware(0, "123456789", 9), 0xE3069283u);
  }
}

// Vectors from RFC 3720 (iSCSI), appendix B.4.
TEST(Crc32cTest, Rfc3720Vectors) {
  std::vector<uint8_t> buf(32, 0);
  EXPECT_EQ(Value(buf.data(), buf.size()), 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xFF);
  EXPECT_EQ(Value(buf.data(), buf.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Value(buf.data(), buf.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(Value(buf.data(), buf.size()), 0x113FDB5Cu);
}

TEST(Crc32cTest, EmptyInputKeepsTheCrc) {
  EXPECT_EQ(Value("", 0), 0u);
  EXPECT_EQ(Extend(0x12345678u, nullptr, 0), 0x12345678u);
}

TEST(Crc32cTest, ExtendEqualsValueOfConcatenation) {
  const std::string a = "hello, ", b = "checkpoint shard";
  EXPECT_EQ(Extend(Value(a), b.data(), b.size()), Value(a + b));
}

// Both implementations over every length 0..300 and every start alignment 0..7 (the
// slicing and the hardware loop each have head/tail paths), then large random buffers.
TEST(Crc32cTest, PortableAndHardwareAgreeOnRandomData) {
  if (!HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(1 << 20);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(ExtendPortable(seed, buf.data() + offset, n),
                ExtendHardware(seed, buf.data() + offset, n))
          << "offset " << offset << " n " << n;
    }
  }
  EXPECT_EQ(ExtendPortable(0, buf.data(), buf.size()), ExtendHardware(0, buf.data(), buf.size()));
  EXPECT_EQ(ExtendPortable(0, buf.data() + 3, buf.size() - 5),
            ExtendHardware(0, buf.data() + 3, buf.size() - 5));
}

TEST(Crc32cTest, DetectsASingleBitFlip) {
  std::vector<uint8_t> buf(4096, 7);
  const uint32_t before = Value(buf.data(), buf.size());
  buf[1234] ^= 0x10;
  EXPECT_NE(Value(buf.data(), buf.size()), before);
}

}  // namespace
}  // namespace drover::crc32c
