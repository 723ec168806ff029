// Thread count for the CPU kernels: OpenMP loops and OpenBLAS GEMMs share one setting.
#pragma once

namespace drover::engine {

// Sets the number of threads used by CPU kernels (OpenMP and BLAS). n <= 0 means "all
// cores". Call before the first kernel runs; not thread-safe against running kernels.
void SetNumThreads(int n);

// The current setting.
int NumThreads();

}  // namespace drover::engine
