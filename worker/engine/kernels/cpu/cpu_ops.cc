// CpuOps: the kernel table over kernels/cpu/ (OpenMP + OpenBLAS) and host memory.
#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "worker/engine/kernels/cpu/attention.h"
#include "worker/engine/kernels/cpu/crossentropy.h"
#include "worker/engine/kernels/cpu/encoder.h"
#include "worker/engine/kernels/cpu/gelu.h"
#include "worker/engine/kernels/cpu/layernorm.h"
#include "worker/engine/kernels/cpu/matmul.h"
#include "worker/engine/kernels/cpu/round.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/grad_clip.h"

namespace drover::engine {
namespace {

// Below this many elements an OpenMP parallel region costs more than it saves.
constexpr int64_t kParallelThreshold = int64_t{1} << 15;

class CpuAllocator final : public Allocator {
 public:
  float* Allocate(size_t n) override {
    if (n == 0) return nullptr;
    // 64 bytes: a cache line, and the widest vector load (AVX-512).
    const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    DROVER_CHECK_MSG(p != nullptr, "out of host memory");
    std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }
  void Free(float* p) override { std::free(p); }
};

}  // namespace

Allocator* HostAllocator() {
  static CpuAllocator allocator;
  return &allocator;
}

namespace {

class CpuOpsImpl final : public Ops {
 public:
  const char* name() const override { return "cpu"; }
  Allocator* allocator() override { return HostAllocator(); }
  Allocator* host_allocator() override { return HostAllocator(); }

  void Fill(float* x, float value, size_t n) override {
    if (value == 0.0f) {
      std::memset(x, 0, n * sizeof(float));
      return;
    }
    for (size_t i = 0; i < n; ++i) x[i] = value;
  }
  void Copy(float* dst, const float* src, size_t n) override {
    if (n > 0 && dst != src) std::memmove(dst, src, n * sizeof(float));
  }
  void Add(float* y, const float* x, size_t n) override {
    const auto count = static_cast<int64_t>(n);
#pragma omp parallel for simd schedule(static) if (count > kParallelThreshold)
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
  }
  void Scale(float* x, size_t n, float s) override { ScaleInPlace(x, n, s); }
  double SumSquares(const float* x, size_t n) override { return engine::SumSquares(x, n); }
  void ToHost(float* host, const float* x, size_t n) override { Copy(host, x, n); }
  void FromHost(float* x, const float* host, size_t n) override { Copy(x, host, n); }
  void Round(float* x, size_t n, Precision p) override {
    if (p == Precision::kBf16) cpu::RoundToBf16(x, n);
    if (p == Precision::kFp16) cpu::RoundToFp16(x, n);
  }

  void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                      int T, int C, Precision store) override {
    cpu::EncoderForward(out, inp, wte, wpe, B, T, C);
    Round(out, static_cast<size_t>(B) * T * C, store);
  }
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                       int T, int C) override {
    cpu::EncoderBackward(dwte, dwpe, dout, inp, B, T, C);
  }
  void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                             const float* dout, const int32_t* inp, int B, int T, int C) override {
    cpu::EncoderBackwardWindow(dwindow, lo, hi, wpe_offset, dout, inp, B, T, C);
  }
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, Precision store) override {
    cpu::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C);
    Round(out, static_cast<size_t>(N) * C, store);
  }
  // An operand buffer is floats here: dout_operand changes nothing.
  void LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                         const float* dout, bool /*dout_operand*/, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int N, int C,
                         bool accumulate, Precision store) override {
    cpu::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, accumulate);
    Round(dinp, static_cast<size_t>(N) * C, store);
    if (dinp_copy != nullptr) Copy(dinp_copy, dinp, static_cast<size_t>(N) * C);
  }
  // Operand buffers are floats here: the flags change nothing.
  void MatmulForward(float* out, bool /*out_operand*/, const float* inp, const float* weight,
                     const float* bias, const float* residual, int N, int C, int OC, int ldo,
                     Precision /*operands: fp32 products of them are exact (ops.h)*/) override {
    cpu::MatmulForward(out, inp, weight, bias, residual, N, C, OC, ldo);
  }
  void MatmulBackward(float* dinp, bool /*dinp_operand*/, float* dweight, float* dbias,
                      const float* dout, bool /*dout_operand*/, const float* inp,
                      const float* weight, int N, int C, int OC, int ldo, bool accumulate,
                      Precision /*operands*/) override {
    cpu::MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ldo, accumulate);
  }
  void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                        Precision operands) override {
    cpu::AttentionForward(out, att, qkv, B, T, C, NH);
    Round(out, static_cast<size_t>(B) * T * C, operands);
  }
  void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH) override {
    cpu::AttentionDecode(out, qkv, from, rows, C, NH);
  }
  void AttentionBackward(float* dqkv, const float* dout, bool /*dout_operand*/,
                         const float* /*out*/, const float* att, const float* qkv, int B, int T,
                         int C, int NH, Precision operands) override {
    cpu::AttentionBackward(dqkv, dout, att, qkv, B, T, C, NH);
    Round(dqkv, static_cast<size_t>(B) * T * 3 * C, operands);
  }
  void GeluForward(float* out, const float* inp, size_t N, Precision store) override {
    cpu::GeluForward(out, inp, N);
    Round(out, N, store);
  }
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N,
                    Precision store) override {
    cpu::GeluBackward(dinp, inp, dout, N);
    Round(dinp, N, store);
  }
  // The logits were rounded as they were written (NarrowWritten is Round here).
  float CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int N, int V, int Vp, Precision /*operands*/) override {
    return cpu::CrossEntropyForward(losses, lse, logits, targets, N, V, Vp);
  }
  // Operand buffers are floats here (OperandFloats): the model passes dlogits == logits.
  void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            Precision store) override {
    Copy(dlogits, logits, static_cast<size_t>(N) * Vp);
    cpu::CrossEntropyBackward(dlogits, lse, targets, dloss, N, V, Vp);
    Round(dlogits, static_cast<size_t>(N) * Vp, store);
  }
  void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                               const int32_t* targets, int N, int V, int Vp,
                               Precision /*operands*/) override {
    cpu::CrossEntropyPartForward(lse, target_logits, logits, targets, N, V, Vp);
  }
  float CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                            const float* target_logits, int parts, int N) override {
    return cpu::CrossEntropyCombine(losses, lse, lse_parts, target_logits, parts, N);
  }

  void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                   float weight_decay, const AdamWConfig& config, int64_t t) override {
    engine::AdamWUpdate(params, grads, m, v, n, lr, weight_decay, config, t);
  }

 private:
};

}  // namespace

Ops* CpuOps() {
  static CpuOpsImpl* ops = new CpuOpsImpl();  // never destroyed: used until exit
  return ops;
}

}  // namespace drover::engine
