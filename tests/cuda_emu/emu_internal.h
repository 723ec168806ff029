// What the kernel emulator's files (cuda_emu.cc, runtime.cc, cublas.cc) share among
// themselves; nothing outside tests/cuda_emu includes it.
#pragma once

#include <cstddef>

#include "cuda_runtime_api.h"

namespace drover_emu {

// Reports `what` as the emulator's and aborts: what a device would fault on.
[[noreturn]] void Die(const char* what);
// This host thread's error for cudaGetLastError: launches the device would refuse set it.
cudaError_t& LastError();
// The dynamic shared memory a kernel may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin).
int OptInDynamicShared();
// A GPU failure a test injects: DROVER_EMU_GPU_FAULT=DEVICE@FILE fails the GPU of a process
// whose CUDA_VISIBLE_DEVICES starts with DEVICE (as the agent gives each slot's trainer
// one), from the first call that finds FILE exists: cudaErrorECCUncorrectable from then
// on, from every synchronisation, query and launch check, as a real GPU's error is sticky.
// cudaSuccess otherwise.
cudaError_t InjectedFault();

}  // namespace drover_emu
