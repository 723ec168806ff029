// The kernel emulator's stand-in (tests/cuda_emu/README.md): a bf16 value in 2 bytes, as on
// the device (shared-memory layouts and alignments come out the same): the top half of the
// fp32 it rounds to (round to nearest even, as the device's conversion).
#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 {
  uint16_t bits;
};
__nv_bfloat16 __float2bfloat16_rn(float x);
inline float __bfloat162float(__nv_bfloat16 x) {
  const uint32_t u = uint32_t{x.bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
