// The kernel emulator's stand-in (tests/cuda_emu/README.md).
#pragma once
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
