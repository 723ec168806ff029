// A device buffer that only grows: the kernel table's scratch (cuda_ops.cu) and the GEMMs'
// 16-bit operand copies (matmul.cu). Get may cudaMalloc, so a step allocates only the first
// time a buffer grows; the memory is kept until the process exits. Not thread-safe: each
// buffer belongs to the thread that enqueues the kernels using it, on one stream, so a
// kernel still reading the old contents is ordered before any that writes new ones.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "worker/engine/kernels/cuda/cuda_check.h"
#include "worker/engine/kernels/cuda/device_memory.h"

namespace drover::engine::cuda {

template <typename T>
class Scratch {
 public:
  // At least n elements (256-byte aligned, as cudaMalloc's), and the rest of the 16 bytes
  // the last one ends in, zeros when new: cuBLAS's kernels for 16-byte aligned operands read
  // whole 16-byte words, past the last element of a matrix whose rows end inside one (a
  // GEMM's staged dout with ldo > OC: compute-sanitizer's memcheck saw the read on an H200).
  // Growing frees the old memory at once: cudaFree synchronises with the device first, so
  // no kernel still uses it.
  T* Get(size_t n) {
    if (n > size_) {
      if (data_ != nullptr) DROVER_CUDA_CHECK(CountedFree(data_));
      const size_t bytes = (n * sizeof(T) + 15) / 16 * 16;
      data_ = static_cast<T*>(DeviceMallocOrExit(bytes));
      // On the legacy stream, waited for: the table's streams do not wait for it.
      DROVER_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes, nullptr));
      DROVER_CUDA_CHECK(cudaStreamSynchronize(nullptr));
      size_ = bytes / sizeof(T);
    }
    return data_;
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace drover::engine::cuda
