// The kernel emulator (tests/cuda_emu/README.md): what nvcc gives CUDA C++ beyond C++ —
// kernel and memory-space qualifiers, the thread indices, __syncthreads, warp shuffles,
// device math and the launch — defined so that the CUDA kernel table's .cu files compile as
// plain C++ and their kernels run on the CPU. Force-included (-include) before each file.
// Every block runs its threads as fibers on one host thread; a barrier or a shuffle switches
// fibers, so the kernels' synchronisation is exercised, deterministically. A launch runs
// later, on its stream's thread, as a GPU runs it behind the host.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// One block runs at a time on a thread: a static per host thread is the block's shared
// memory.
#define __shared__ static thread_local

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(8) float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct CUstream_st;  // cudaStream_t (cuda_runtime_api.h)
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace drover_emu {

struct ThreadIndex {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
// The running emulated thread's indices, set by the block scheduler at each switch into a
// thread (cuda_emu.cc); null outside a kernel. Hidden and constant-initialised, so that
// Current() inlines into the kernels: their threadIdx reads then share one __tls_get_addr
// a function, where a call into the runtime cost one per read (a fifth of an emulated
// trainer's time).
extern thread_local constinit const ThreadIndex* g_current_index
    __attribute__((visibility("hidden")));
[[noreturn]] void DieOutsideKernel();
// The running emulated thread's indices (aborts outside a kernel).
inline const ThreadIndex& Current() {
  const ThreadIndex* index = g_current_index;
  if (index == nullptr) [[unlikely]]
    DieOutsideKernel();
  return *index;
}
void SyncThreads();
// __syncwarp: every live lane of the running thread's warp arrives before any goes on.
void SyncWarp();
// The running thread's lane (0..31), and 256 floats its warp shares (the emulated tensor
// cores' output tile: include/mma.h).
unsigned Lane();
float* WarpTile();
// The running block's dynamic shared memory (the launch's shared_bytes, filled with NaN
// bytes at each block's start: a device leaves it uninitialised).
unsigned char* DynamicShared();
// Every live lane of the warp passes `value`; each gets that of lane ^ offset.
double ShuffleXor(double value, int offset);
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (PTX ISA, "Matrix Fragments
// for mma.m16n8k16 with floating point type"): d (16 x 8) = a (16 x 16) b (16 x 8) + c for
// the warp, every lane holding its fragments in the PTX layout (g = lane / 4, t = lane % 4;
// the first element of a register in its low 16 bits):
//   a[0] = A(g, 2t..2t+1)   a[1] = A(g+8, 2t..2t+1)   a[2] = A(g, 2t+8..)   a[3] = A(g+8, 2t+8..)
//   b[0] = B(2t..2t+1, g)   b[1] = B(2t+8..2t+9, g)
//   c, d = C(g, 2t), C(g, 2t+1), C(g+8, 2t), C(g+8, 2t+1)
// Warp-wide: every lane of the warp must reach it. The products of 16-bit values are exact in
// fp32; each output adds them to c in k order (the tensor cores' order is their own).
void MmaM16N8K16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool fp16);
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (PTX ISA, "ldmatrix"): four 8 x 8
// matrices of 16-bit elements from shared memory, lane l giving the address of row l % 8 of
// matrix l / 8 (16 bytes, 16-byte aligned, inside the block's shared memory). Lane L gets
// r[i] = M_i(L / 4, 2 (L % 4)) | M_i(L / 4, 2 (L % 4) + 1) << 16, or with `trans`
// M_i(2 (L % 4), L / 4) | M_i(2 (L % 4) + 1, L / 4) << 16. Warp-wide, like mma.sync.
void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans);
// cp.async.cg.shared.global (16 bytes) or cp.async.ca (4, 8): `src_bytes` bytes of `src`
// then zeros, into shared memory at `dst`. As on the device, the copy lands only when this
// thread waits for its group (CpAsyncWait): a kernel that reads the tile without waiting
// reads what was there before (NaN bytes in a fresh block).
void CpAsync(void* dst, const void* src, int bytes, int src_bytes);
// cp.async.commit_group: this thread's copies since the last commit become a group.
void CpAsyncCommit();
// cp.async.wait_group n: all but the newest `n` of this thread's groups have landed.
void CpAsyncWait(int n);
// Whether the device takes a launch of `kernel` in this configuration: false (with the error
// cudaGetLastError returns set) for one it would refuse: an invalid configuration, or more
// than 48 KiB of dynamic shared memory unless the kernel's
// cudaFuncAttributeMaxDynamicSharedMemorySize allows it. Checked at the launch, on the
// launching thread, as the device reports it.
bool LaunchAccepted(dim3 grid, dim3 block, size_t shared_bytes, const void* kernel);
// Runs `body` as every thread of `grid` x `block`, block after block, with `shared_bytes`
// of dynamic shared memory.
void Run(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);
// Device work (a kernel, a copy, a GEMM) enqueued on `stream` (runtime.cc: Stream): it runs
// later, in the stream's order, on the stream's thread; the null stream runs it at the call.
void EnqueueWork(CUstream_st* stream, std::function<void()> work);

// Aborts, as the device faults, when kernel argument `index` (from 0) points to memory the
// device cannot reach: pageable host memory, or memory already freed. Null is taken (an
// argument a kernel does not use), and so is the end of an allocation (an empty range's).
void CheckKernelPointer(const void* p, int index);

// A launch: the arguments are copied when it is made, as the device takes them, and the
// kernel runs when its stream gets to it.
template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t shared_bytes;
  CUstream_st* stream;
  template <typename... A>
  void operator()(const A&... args) const {
    if (!LaunchAccepted(grid, block, shared_bytes, reinterpret_cast<const void*>(kernel))) return;
    std::tuple<std::decay_t<P>...> params(args...);
    std::apply(
        [](const auto&... p) {
          int index = 0;
          (CheckIfPointer(p, index++), ...);
        },
        params);
    EnqueueWork(stream, [kernel = kernel, grid = grid, block = block, shared = shared_bytes,
                         params = std::move(params)] {
      Run(grid, block, shared, [&] { std::apply(kernel, params); });
    });
  }

 private:
  template <typename T>
  static void CheckIfPointer(const T& value, int index) {
    if constexpr (std::is_pointer_v<T>) CheckKernelPointer(value, index);
  }
};
template <typename... P>
Launcher<P...> Launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
                      CUstream_st* stream) {
  return {kernel, grid, block, shared_bytes, stream};
}

// cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize for `func`.
int SetMaxDynamicShared(const void* func, int value);

// Whether [p, p + bytes) lies inside one emulated device allocation (cudaMalloc).
bool InDeviceMemory(const void* p, size_t bytes);

}  // namespace drover_emu

#define threadIdx (::drover_emu::Current().thread)
#define blockIdx (::drover_emu::Current().block)
#define blockDim (::drover_emu::Current().block_dim)
#define gridDim (::drover_emu::Current().grid_dim)
#define DROVER_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::drover_emu::Launch(kernel, grid, block, shared_bytes, stream)
#define DROVER_DYNAMIC_SHARED(name) unsigned char* name = ::drover_emu::DynamicShared()

inline void __syncthreads() { ::drover_emu::SyncThreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::drover_emu::SyncWarp(); }
inline float __shfl_xor_sync(unsigned, float v, int offset, int = 32) {
  return static_cast<float>(::drover_emu::ShuffleXor(v, offset));
}
inline double __shfl_xor_sync(unsigned, double v, int offset, int = 32) {
  return ::drover_emu::ShuffleXor(v, offset);
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
