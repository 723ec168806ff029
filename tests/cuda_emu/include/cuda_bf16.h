// The kernel emulator's stand-in (tests/cuda_emu/README.md): a bf16 value kept as the float
// it rounds to (round to nearest even, as the device's conversion).
#pragma once
struct __nv_bfloat16 {
  float value;
};
__nv_bfloat16 __float2bfloat16_rn(float x);
inline float __bfloat162float(__nv_bfloat16 x) { return x.value; }
