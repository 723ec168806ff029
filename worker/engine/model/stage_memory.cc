#include "worker/engine/model/stage_memory.h"

namespace drover::engine {

FlatStageMemory::FlatStageMemory(const GptLayout* layout, Ops* ops, float* params, float* grads)
    : layout_(layout),
      ops_(ops),
      params_(params),
      grads_(grads),
      zero_pending_(layout->units().size(), false) {}

StatusOr<const float*> FlatStageMemory::AcquireParams(int unit) {
  return static_cast<const float*>(params_ + layout_->units()[unit].offset);
}

Status FlatStageMemory::ReleaseParams(int) { return OkStatus(); }

StatusOr<float*> FlatStageMemory::AcquireGrads(int unit, bool* accumulate) {
  *accumulate = !zero_pending_[unit];
  zero_pending_[unit] = false;
  return grads_ + layout_->units()[unit].offset;
}

Status FlatStageMemory::GradsReady(int) { return OkStatus(); }

Status FlatStageMemory::AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout, int B,
                                          int T) {
  DROVER_CHECK_MSG(!zero_pending_[unit], "the embedding's gradient was never acquired");
  float* g = grads_ + layout_->units()[unit].offset;
  ops_->EncoderBackward(g, g + layout_->wpe_offset(), dout, inputs, B, T,
                        layout_->config().channels);
  return OkStatus();
}

void FlatStageMemory::ZeroGrad() { zero_pending_.assign(zero_pending_.size(), true); }

void FlatStageMemory::MaterializeZeros() {
  const auto& units = layout_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    if (!zero_pending_[u]) continue;
    ops_->Fill(grads_ + units[u].offset, 0.0f, units[u].numel);
    zero_pending_[u] = false;
  }
}

}  // namespace drover::engine
