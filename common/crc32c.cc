#include "common/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#include "common/status.h"

namespace drover::crc32c {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78;  // 0x1EDC6F41, bit-reversed

// kTables[0] is the classic byte table; kTables[k][b] is the CRC of byte b followed by k
// zero bytes, which lets slicing-by-8 fold eight input bytes with eight lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1) ? kPolynomial : 0);
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFF];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = ~crc;
  // Align to 8 bytes so the 64-bit loads below never straddle a cache line needlessly.
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n) {
    c = __builtin_ia32_crc32qi(static_cast<uint32_t>(c), *p++);
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, sizeof(v));
    c = __builtin_ia32_crc32di(c, v);
  }
  for (; n > 0; --n) c = __builtin_ia32_crc32qi(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}
#endif

}  // namespace

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  if constexpr (std::endian::native == std::endian::little) {
    for (; n >= 8; n -= 8, p += 8) {
      const uint32_t lo = Load32(p) ^ c;
      const uint32_t hi = Load32(p + 4);
      c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^
          kTables[4][lo >> 24] ^ kTables[3][hi & 0xFF] ^ kTables[2][(hi >> 8) & 0xFF] ^
          kTables[1][(hi >> 16) & 0xFF] ^ kTables[0][hi >> 24];
    }
  }
  for (; n > 0; --n) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool HardwareAvailable() {
#if defined(__x86_64__)
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
#else
  return false;
#endif
}

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
  DROVER_CHECK_MSG(HardwareAvailable(), "CRC-32C: this CPU has no SSE4.2 crc32 instruction");
#if defined(__x86_64__)
  return ExtendSse42(crc, static_cast<const uint8_t*>(data), n);
#else
  return ExtendPortable(crc, data, n);
#endif
}

uint32_t Extend(uint32_t crc, const void* data, size_t n) {
  static const auto impl = HardwareAvailable() ? &ExtendHardware : &ExtendPortable;
  return impl(crc, data, n);
}

}  // namespace drover::crc32c
