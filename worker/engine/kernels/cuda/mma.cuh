// One warp's 16 x 8 x 16 product on the tensor cores, with the operands in registers: PTX's
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} (sm_80 and later), the instruction the
// warp matrix functions (wmma) hide behind fragments of an unspecified layout. Here the
// layout is the PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating point type"), so
// a kernel may keep an accumulator in registers, rescale its rows there, and turn one
// product's output into the next one's input without a trip through shared memory (what
// attention_mma.cu is built on). With g = lane / 4 and t = lane % 4, and a register's first
// element in its low 16 bits:
//
//   A (16 x 16, row-major):  a[0] = A(g, 2t..2t+1)    a[1] = A(g+8, 2t..2t+1)
//                            a[2] = A(g, 2t+8..2t+9)  a[3] = A(g+8, 2t+8..2t+9)
//   B (16 x 8, "col"):       b[0] = B(2t..2t+1, g)    b[1] = B(2t+8..2t+9, g)
//   C, D (16 x 8, fp32):     d[0] = D(g, 2t)   d[1] = D(g, 2t+1)   d[2] = D(g+8, 2t)
//                            d[3] = D(g+8, 2t+1)
//
// So the accumulators of two adjacent 8-column products, d of columns 0-7 and d' of 8-15,
// are the A fragment of a 16-wide k step once narrowed in pairs: {d0,d1}, {d2,d3}, {d'0,d'1},
// {d'2,d'3}. And a B operand stored row-major by its n index (B(k, n) = X[n][k], as K is for
// q k^T) is X[g][2t..2t+1] and X[g][2t+8..2t+9]: what ldmatrix (LdMatrixX4 below) gives each
// lane, four registers an instruction, from such a tile or, transposed, from one stored by
// its k index.
//
// The kernel emulator (tests/cuda_emu/) implements the same layout from the same
// specification (drover_emu::MmaM16N8K16); only a GPU can say both read it right, which is
// what the device check's attention test is for.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "worker/engine/kernels/cuda/store.cuh"

namespace drover::engine::cuda {

// d += a b for the warp: every lane must call it (it is warp-synchronous). N is the
// operands' 16-bit type.
template <typename N>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<N, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#elif !defined(__CUDACC__)
  ::drover_emu::MmaM16N8K16(d, a, b, std::is_same_v<N, __half>);
#endif
}

// Four 8 x 8 matrices of 16-bit elements from shared memory into a warp's registers, as
// mma operands: PTX's ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16. Lane l gives `row`,
// the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned); lane L receives
// r[i] = M_i(g, 2t..2t+1) (g = L / 4, t = L % 4: the B layout of a matrix stored by its n
// index, X[n][k], and each quarter of the A layout), or with kTrans r[i] = M_i(2t, g) and
// M_i(2t+1, g) (the B layout of a matrix stored by its k index, X[k][n]). One instruction
// where the same registers from 32-bit loads take four, and it reads a tile in either
// orientation from one row-major copy. Warp-synchronous: every lane must call it.
template <bool kTrans>
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__)
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  }
#elif !defined(__CUDACC__)
  ::drover_emu::LdMatrixX4(r, row, kTrans);
#endif
}

// 2^x by the special function unit (ex2.approx.ftz: 2 ulp, results below 2^-126 flushed to
// zero): what a softmax's exponentials need, and one instruction where exp2f's handling of
// subnormal results adds several.
__device__ __forceinline__ float FastExp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Two values narrowed to N (round to nearest even), packed as an operand register: `lo` in
// the low 16 bits.
template <typename N>
__device__ __forceinline__ uint32_t PackNarrow(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  // One F2FP pack instruction where two conversions, a shift and an or would take four.
  uint32_t packed;
  if constexpr (std::is_same_v<N, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo: the low half
    std::memcpy(&packed, &v, sizeof(packed));
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    std::memcpy(&packed, &v, sizeof(packed));
  }
  return packed;
#else
  const N a = ToNarrow<N>(lo), b = ToNarrow<N>(hi);
  uint16_t ua, ub;
  std::memcpy(&ua, &a, sizeof(ua));
  std::memcpy(&ub, &b, sizeof(ub));
  return static_cast<uint32_t>(ua) | (static_cast<uint32_t>(ub) << 16);
#endif
}

}  // namespace drover::engine::cuda
