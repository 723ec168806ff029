// The kernel emulator's stand-in (tests/cuda_emu/README.md): an fp16 value kept as the float
// it rounds to (round to nearest even; overflow to inf, subnormals kept).
#pragma once
struct __half {
  float value;
};
__half __float2half_rn(float x);
inline float __half2float(__half x) { return x.value; }
