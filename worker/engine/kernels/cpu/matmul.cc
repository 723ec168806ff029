#include "worker/engine/kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "worker/engine/kernels/cpu/simd.h"

namespace drover::engine::cpu {
namespace {

// Why the GEMMs are split across OpenMP threads instead of left to OpenBLAS's own pool:
// Debian's OpenBLAS runs its own pthreads, and the element-wise kernels run OpenMP
// threads. Alternating the two pools (~300 times per step) makes each pool's idle
// threads spin while the other pool works, so on few cores every GEMM and every kernel
// shares its cores with spinners; measured at GPT-2 124M shapes on 2 threads, the
// forward+backward took about twice its isolated GEMM time. With one pool (OpenMP) and
// single-threaded sgemm calls on disjoint output blocks, nothing spins against the work.
// OpenBLAS is held at one thread only for the duration of a call, so other cblas users
// keep the setting of engine::SetNumThreads.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas() : saved_(openblas_get_num_threads()) {
    if (saved_ != 1) openblas_set_num_threads(1);
  }
  ~SingleThreadedBlas() {
    if (saved_ != 1) openblas_set_num_threads(saved_);
  }

 private:
  int saved_;
};

// The part'th of `parts` contiguous ranges of [0, n), aligned to 16 floats (64 bytes) so
// that threads never write the same cache line of an output row.
void Split(int n, int part, int parts, int* begin, int* end) {
  const int chunk = ((n + parts - 1) / parts + 15) / 16 * 16;
  *begin = std::min(n, part * chunk);
  *end = std::min(n, *begin + chunk);
}

DROVER_CPU_CLONES
void FillBlock(float* __restrict out, const float* __restrict residual,
               const float* __restrict bias, int N, int o0, int o1, int ldo) {
  for (int n = 0; n < N; n++) {
    float* __restrict o = out + static_cast<size_t>(n) * ldo;
    if (residual != nullptr && bias != nullptr) {
      const float* __restrict r = residual + static_cast<size_t>(n) * ldo;
      for (int j = o0; j < o1; j++) o[j] = r[j] + bias[j];
    } else if (residual != nullptr) {
      std::memcpy(o + o0, residual + static_cast<size_t>(n) * ldo + o0, sizeof(float) * (o1 - o0));
    } else {
      std::memcpy(o + o0, bias + o0, sizeof(float) * (o1 - o0));
    }
  }
}

DROVER_CPU_CLONES
void ColumnSums(float* __restrict acc, const float* __restrict dout, int N, int o0, int o1,
                int ldo) {
  for (int n = 0; n < N; n++) {
    const float* __restrict row = dout + static_cast<size_t>(n) * ldo;
    for (int o = o0; o < o1; o++) acc[o] += row[o];
  }
}

}  // namespace

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                   const float* residual, int N, int C, int OC, int ldo) {
  SingleThreadedBlas blas;
  // Every thread owns a block of output columns (= a block of weight rows).
#pragma omp parallel
  {
    int o0, o1;
    Split(OC, omp_get_thread_num(), omp_get_num_threads(), &o0, &o1);
    if (o0 < o1) {
      float beta = 0.0f;
      if (bias != nullptr || residual != nullptr) {
        FillBlock(out, residual, bias, N, o0, o1, ldo);
        beta = 1.0f;  // the sgemm adds onto bias + residual: no separate pass
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, o1 - o0, C, 1.0f, inp, C,
                  weight + static_cast<size_t>(o0) * C, C, beta, out + o0, ldo);
    }
  }
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC, int ldo, bool accumulate) {
  SingleThreadedBlas blas;
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), threads = omp_get_num_threads();
    int b, e;
    if (dinp != nullptr) {
      // dinp columns [b, e) = dout @ weight[:, b:e].
      Split(C, tid, threads, &b, &e);
      if (b < e) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, e - b, OC, 1.0f, dout, ldo,
                    weight + b, C, 0.0f, dinp + b, C);
      }
    }
    // dweight rows [b, e) = dout[:, b:e]^T @ inp; dbias [b, e) likewise: no reduction.
    Split(OC, tid, threads, &b, &e);
    if (b < e) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, e - b, C, N, 1.0f, dout + b, ldo, inp, C,
                  accumulate ? 1.0f : 0.0f, dweight + static_cast<size_t>(b) * C, C);
      if (dbias != nullptr) {
        if (!accumulate) std::fill(dbias + b, dbias + e, 0.0f);
        ColumnSums(dbias, dout, N, b, e, ldo);
      }
    }
  }
}

}  // namespace drover::engine::cpu
