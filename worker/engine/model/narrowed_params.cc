#include "worker/engine/model/narrowed_params.h"

namespace drover::engine {

NarrowedParams::NarrowedParams(const GptLayout* layout, Ops* ops, Precision precision,
                               StageMemory* inner)
    : layout_(layout),
      ops_(ops),
      precision_(precision),
      inner_(inner),
      narrowed_(layout->units().size()),
      fresh_(layout->units().size(), false) {
  DROVER_CHECK(precision != Precision::kFp32);
}

StatusOr<const float*> NarrowedParams::AcquireParams(int unit) {
  ASSIGN_OR_RETURN(const float* master, inner_->AcquireParams(unit));
  if (!fresh_[unit]) {
    const size_t n = layout_->units()[unit].numel;
    if (narrowed_[unit].size() != n) narrowed_[unit] = ops_->Allocate(n);
    ops_->RoundCopy(narrowed_[unit].data(), master, n, precision_);
    fresh_[unit] = true;
  }
  return static_cast<const float*>(narrowed_[unit].data());
}

void NarrowedParams::Invalidate() { fresh_.assign(fresh_.size(), false); }

}  // namespace drover::engine
