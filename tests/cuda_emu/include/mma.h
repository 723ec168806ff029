// The kernel emulator's stand-in for the warp matrix functions (nvcuda::wmma, tests/cuda_emu/
// README.md), as far as the kernel table uses them: 16x16x16 bf16 / fp16 and 16x16x8 tf32
// tiles with fp32 accumulators.
//
// The contract is CUDA's, and the emulator holds kernels to it:
// - which elements of a tile a lane's fragment holds is unspecified. Here every lane holds the
//   whole tile, stored transposed (x[col * rows + row]), so that code may apply one operation
//   to every x[i] alike, as CUDA allows, and code that assumes an order gets wrong numbers;
// - load / store pointers are 256-bit aligned and ldm is a multiple of 16 bytes (else abort,
//   where a device would fault or misbehave);
// - mma_sync is warp-wide: every lane of the warp must reach it (a missing lane is a deadlock
//   the emulator reports). The lanes share the work, each forming 8 of the 256 outputs in
//   fp32 with the k products added in order, and exchange them through the warp's tile;
// - tf32 operands are read as the tensor cores read them: only the top 19 bits of each
//   float (a value that skipped __float_to_tf32 is truncated). bf16 / fp16 values are
//   2-byte encodings, as on the device (cuda_bf16.h, cuda_fp16.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"
#include "cuda_emu.h"
#include "cuda_fp16.h"

namespace nvcuda::wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <typename T>
using Element = std::conditional_t<std::is_same_v<T, precision::tf32>, float, T>;

inline float Value(float x) { return x; }
inline float Value(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float Value(__half x) { return __half2float(x); }

// The bits of a tf32 operand the tensor cores read.
inline float AsTf32Read(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= ~0x1FFFu;
  std::memcpy(&x, &u, 4);
  return x;
}

inline void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "cuda emulator: wmma: %s\n", what);
    std::abort();
  }
}

template <typename T>
void CheckMemory(const T* p, unsigned ldm) {
  Require(reinterpret_cast<uintptr_t>(p) % 32 == 0, "a tile pointer that is not 256-bit aligned");
  Require(ldm * sizeof(T) % 16 == 0, "ldm is not a multiple of 16 bytes");
}

}  // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  using element_type = detail::Element<T>;
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  element_type x[num_elements];

  element_type& at(int r, int c) { return x[c * rows + r]; }
  const element_type& at(int r, int c) const { return x[c * rows + r]; }
};

template <typename Use, int M, int N, int K, typename T, typename L, typename V>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& value) {
  for (auto& e : f.x) e = value;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <typename Use, int M, int N, int K, typename T, typename L, typename P>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const P* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its layout");
  static_assert(std::is_same_v<P, typename fragment<Use, M, N, K, T, L>::element_type>);
  detail::CheckMemory(p, ldm);
  using F = fragment<Use, M, N, K, T, L>;
  for (int r = 0; r < F::rows; ++r) {
    for (int c = 0; c < F::cols; ++c) {
      f.at(r, c) = std::is_same_v<L, row_major> ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}

template <int M, int N, int K, typename T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm,
                      layout_t layout) {
  detail::CheckMemory(p, ldm);
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      f.at(r, c) = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
  }
}

template <int M, int N, int K, typename T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm,
                       layout_t layout) {
  detail::CheckMemory(p, ldm);
  for (int r = 0; r < M; ++r) {
    for (int c = 0; c < N; ++c) {
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.at(r, c);
    }
  }
}

template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d,
              const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  static_assert(std::is_same_v<TA, TB>, "both operands have one type");
  static_assert(M * N == 256 && M * N % 32 == 0);
  float* tile = ::drover_emu::WarpTile();
  const int lane = static_cast<int>(::drover_emu::Lane());
  constexpr int kPerLane = M * N / 32;
  for (int e = lane * kPerLane; e < (lane + 1) * kPerLane; ++e) {
    const int r = e / N, col = e % N;
    float sum = c.at(r, col);
    for (int k = 0; k < K; ++k) {
      float x = detail::Value(a.at(r, k)), y = detail::Value(b.at(k, col));
      if constexpr (std::is_same_v<TA, precision::tf32>) {
        x = detail::AsTf32Read(x);
        y = detail::AsTf32Read(y);
      }
      sum += x * y;
    }
    tile[e] = sum;
  }
  ::drover_emu::SyncWarp();  // every lane's outputs are in the tile
  for (int e = 0; e < M * N; ++e) d.at(e / N, e % N) = tile[e];
  ::drover_emu::SyncWarp();  // every lane has read them, before the tile is written again
}

// Round to nearest, ties away from zero, to 10 explicit significand bits (cvt.rna.tf32.f32).
inline float __float_to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7F800000u) != 0x7F800000u) {  // finite
    u += 0x1000u;
    u &= ~0x1FFFu;
  }
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace nvcuda::wmma
