// A kernel table that times another: each op is run, then the backend is synchronised
// (Ops::Synchronize), and the wall time is charged to the op. The report says where a
// step's time goes, op by op, with the GEMMs' and attention's achieved FLOP rates:
// `drover train --profile-ops`. Synchronising after every op removes the overlap a
// backend with a queue has (the CPU's ops are synchronous anyway), so the total is an
// upper bound of the step time, and the shares are what to optimise first.
//
// Thread-safety: as the table it wraps (ops.h); the counters take a lock, because the
// data-parallel communication thread stages buffers through ToHost/FromHost while the
// training thread runs other ops. Those two threads' times overlap in the report.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/mutex.h"
#include "worker/engine/kernels/ops.h"

namespace drover::engine {

class ProfiledOps final : public Ops {
 public:
  enum Op {
    kFill,
    kCopy,
    kAdd,
    kScale,
    kSumSquares,
    kToHost,
    kFromHost,
    kRound,
    kRoundCopy,
    kNarrowWritten,
    kEncoderForward,
    kEncoderBackward,
    kEncoderBackwardWindow,
    kLayerNormForward,
    kLayerNormBackward,
    kMatmulForward,
    kMatmulBackward,
    kAttentionForward,
    kAttentionBackward,
    kAttentionDecode,
    kGeluForward,
    kGeluBackward,
    kMatmulGeluForward,
    kGeluMatmulBackward,
    kCrossEntropyForward,
    kCrossEntropyBackward,
    kCrossEntropyForwardBackward,
    kCrossEntropyPartForward,
    kCrossEntropyCombine,
    kAdamWUpdate,
    kOpCount
  };
  struct Totals {
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;  // GEMMs and attention only
  };

  // `inner` is not owned and outlives this.
  explicit ProfiledOps(Ops* inner) : inner_(inner) {}

  Totals totals(Op op) const;
  // One line per op that ran, the most time first: calls, total and per-step milliseconds,
  // share of the profiled time, and TFLOP/s where the op counts FLOPs. `steps` divides the
  // totals (the optimizer steps the profile covers; at least 1).
  std::string Report(int64_t steps) const;

  const char* name() const override { return inner_->name(); }
  Allocator* allocator() override { return inner_->allocator(); }
  Allocator* host_allocator() override { return inner_->host_allocator(); }
  bool IsDeviceMemory(const void* p) const override { return inner_->IsDeviceMemory(p); }
  uint64_t device_allocations() const override { return inner_->device_allocations(); }
  DeviceBytesHeld device_bytes() const override { return inner_->device_bytes(); }
  void Synchronize() override { inner_->Synchronize(); }
  void MarkWork() override { inner_->MarkWork(); }
  bool MarkedWorkDone() override { return inner_->MarkedWorkDone(); }

  void Fill(float* x, float value, size_t n) override;
  void Copy(float* dst, const float* src, size_t n) override;
  void Add(float* y, const float* x, size_t n) override;
  void Scale(float* x, size_t n, float s) override;
  double SumSquares(const float* x, size_t n) override;
  void ToHost(float* host, const float* x, size_t n) override;
  void FromHost(float* x, const float* host, size_t n) override;
  size_t OperandFloats(size_t n, Precision p) const override { return inner_->OperandFloats(n, p); }
  void Round(float* x, size_t n, Precision p) override;
  void RoundCopy(float* dst, const float* src, size_t n, Precision p) override;
  void NarrowWritten(float* x, size_t n, Precision p) override;
  void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                      int T, int C, Precision store) override;
  void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B,
                       int T, int C) override;
  void EncoderBackwardWindow(float* dwindow, size_t lo, size_t hi, size_t wpe_offset,
                             const float* dout, const int32_t* inp, int B, int T, int C) override;
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                        const float* bias, int N, int C, Precision store) override;
  void LayerNormBackward(float* dinp, float* dinp_copy, float* dweight, float* dbias,
                         const float* dout, bool dout_operand, const float* inp,
                         const float* weight, const float* mean, const float* rstd, int N, int C,
                         bool accumulate, Precision store) override;
  void MatmulForward(float* out, bool out_operand, const float* inp, const float* weight,
                     const float* bias, const float* residual, int N, int C, int OC, int ldo,
                     Precision operands) override;
  void MatmulBackward(float* dinp, bool dinp_operand, float* dweight, float* dbias,
                      const float* dout, bool dout_operand, const float* inp, const float* weight,
                      int N, int C, int OC, int ldo, bool accumulate, Precision operands) override;
  size_t AttentionStateFloats(int B, int T, int C, int NH, Precision operands) const override {
    return inner_->AttentionStateFloats(B, T, C, NH, operands);
  }
  void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                        Precision operands) override;
  void AttentionBackward(float* dqkv, const float* dout, bool dout_operand, const float* out,
                         const float* att, const float* qkv, int B, int T, int C, int NH,
                         Precision operands) override;
  void AttentionDecode(float* out, const float* qkv, int from, int rows, int C, int NH) override;
  void GeluForward(float* out, const float* inp, size_t N, Precision store) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, size_t N,
                    Precision store) override;
  // Passed whole to the inner table (its fused version, where it has one), charged as one op.
  void MatmulGeluForward(float* out, float* pre, const float* inp, const float* weight,
                         const float* bias, int N, int C, int OC, Precision operands) override;
  void GeluMatmulBackward(float* dpre, float* dweight, float* dbias, const float* dout,
                          bool dout_operand, const float* inp, const float* weight,
                          const float* pre, int N, int C, int OC, bool accumulate,
                          Precision operands) override;
  float CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int N, int V, int Vp, Precision operands) override;
  void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            Precision store) override;
  float CrossEntropyForwardBackward(float* dlogits, float* losses, float* lse, const float* logits,
                                    const int32_t* targets, float dloss, int N, int V, int Vp,
                                    Precision operands) override;
  void CrossEntropyPartForward(float* lse, float* target_logits, const float* logits,
                               const int32_t* targets, int N, int V, int Vp,
                               Precision operands) override;
  float CrossEntropyCombine(float* losses, float* lse, const float* lse_parts,
                            const float* target_logits, int parts, int N) override;
  void AdamWUpdate(float* params, const float* grads, float* m, float* v, size_t n, float lr,
                   float weight_decay, const AdamWConfig& config, int64_t t) override;
  void AdamWUpdateSegments(float* params, const float* grads, float* m, float* v,
                           const AdamWSegment* segments, size_t count, float lr,
                           const AdamWConfig& config, int64_t t) override;

 private:
  class Timed;  // charges the time from its construction to after Synchronize to one op

  Ops* const inner_;
  mutable Mutex mu_;
  std::array<Totals, kOpCount> totals_ GUARDED_BY(mu_);
};

}  // namespace drover::engine
