// The kernel emulator's stand-in (tests/cuda_emu/README.md): an fp16 value in 2 bytes, IEEE
// binary16 as on the device (round to nearest even; overflow to inf, subnormals kept).
#pragma once
#include <cstdint>
struct __half {
  uint16_t bits;
};
__half __float2half_rn(float x);
float __half2float(__half x);
