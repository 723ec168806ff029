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

}  // namespace drover_emu
