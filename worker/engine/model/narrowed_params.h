// NarrowedParams: the StageMemory a mixed-precision stage reads its weights through. Each
// unit's parameters are the inner memory's fp32 master weights narrowed to the run's
// precision (Ops::Round), made at the unit's first acquisition after an optimizer step and
// reused by every micro-batch until Invalidate. Gradients pass through untouched: they are
// accumulated and reduced in fp32, like the master weights and AdamW's state.
//
// The copy is the "compute weights" of mixed precision (a bf16 or fp16 copy on a GPU); on
// the CPU it holds floats, so it costs a second parameter arena instead of half of one.
//
// Thread-safety: as StageMemory (the training thread only).
#pragma once

#include <vector>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/stage_memory.h"

namespace drover::engine {

class NarrowedParams final : public StageMemory {
 public:
  // `inner` is not owned and must outlive this; `precision` is not kFp32 (CHECKed).
  NarrowedParams(const GptLayout* layout, Ops* ops, Precision precision, StageMemory* inner);

  StatusOr<const float*> AcquireParams(int unit) override;
  Status ReleaseParams(int unit) override { return inner_->ReleaseParams(unit); }
  void PrefetchParams(int unit) override { inner_->PrefetchParams(unit); }
  StatusOr<float*> AcquireGrads(int unit, bool* accumulate) override {
    return inner_->AcquireGrads(unit, accumulate);
  }
  Status GradsReady(int unit) override { return inner_->GradsReady(unit); }
  Status AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout, int B,
                           int T) override {
    return inner_->AddEmbeddingGrads(unit, inputs, dout, B, T);
  }
  bool TiedUnitReadyAfterHead() const override { return inner_->TiedUnitReadyAfterHead(); }

  // The master weights changed (an optimizer step, a load): narrow them again when next
  // acquired.
  void Invalidate();

 private:
  const GptLayout* layout_;
  Ops* ops_;
  const Precision precision_;
  StageMemory* inner_;
  std::vector<Buffer> narrowed_;  // per unit, allocated at its first acquisition
  std::vector<bool> fresh_;       // per unit: narrowed_ holds the current master weights
};

}  // namespace drover::engine
