// The kernel emulator's stand-in for the CUDA runtime's header (tests/cuda_emu/README.md):
// the types and the calls the CUDA kernel table uses, run on the CPU by runtime.cc.
#pragma once

#include <cstddef>
#include <functional>

#include "cuda_emu.h"

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorStubLibrary = 34,
  cudaErrorInsufficientDriver = 35,
  cudaErrorDevicesUnavailable = 46,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorECCUncorrectable = 214,
  cudaErrorNvlinkUncorrectable = 220,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorSystemNotReady = 802,
  cudaErrorSystemDriverMismatch = 803,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
inline constexpr unsigned cudaStreamNonBlocking = 1;

namespace drover_emu {
// Runs `work` on `stream`'s own thread, after the work enqueued there before; streams and
// events recorded after it are not done until it has run (runtime.cc: Stream). The NCCL
// emulator's calls go this way, in either DROVER_EMU_STREAMS mode (EnqueueWork, cuda_emu.h,
// is the kernels', copies' and GEMMs').
void EnqueueOnStream(cudaStream_t stream, std::function<void()> work);
}  // namespace drover_emu
inline constexpr unsigned cudaEventDefault = 0;
inline constexpr unsigned cudaEventDisableTiming = 2;
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
// Up to the device's opt-in limit (sm_90: 227 KiB); the kernel's launches may then ask for
// that much dynamic shared memory.
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
enum cudaDeviceAttr {
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
// That limit (DROVER_EMU_SHARED_OPTIN bytes stand in for a smaller GPU's), and the compute
// capability (9.0, or DROVER_EMU_COMPUTE_CAPABILITY's, e.g. 80 for 8.0), device 0 only.
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetDevice(int* device);

// Device memory is DROVER_EMU_DEVICE_MEMORY bytes (80 GiB unless set; runtime.cc).
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventDestroy(cudaEvent_t event);
// Milliseconds between two timing events' passing (the time their streams reached them):
// cudaErrorNotReady while either is pending, cudaErrorInvalidResourceHandle for an event
// made with cudaEventDisableTiming or never recorded on a stream.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
// The emulated GPU is the first entry of CUDA_VISIBLE_DEVICES (0 when unset): processes
// given different entries are on different GPUs, as the NCCL emulator checks.
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p);
