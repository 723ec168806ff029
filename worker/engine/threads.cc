#include "worker/engine/threads.h"

#include <cblas.h>
#include <omp.h>

namespace drover::engine {

void SetNumThreads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int NumThreads() { return omp_get_max_threads(); }

}  // namespace drover::engine
