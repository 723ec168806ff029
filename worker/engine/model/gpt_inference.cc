#include "worker/engine/model/gpt_inference.h"

#include <algorithm>

namespace drover::engine {
float* ModelParamsOn(const Gpt& model, Ops* ops, Buffer* copy) {
  // The arena is read, never written: there are no optimizer steps here, and FlatStageMemory
  // writes only the gradients, which a forward pass never asks for.
  if (ops == CpuOps()) return const_cast<float*>(model.params());
  *copy = ops->Allocate(model.num_params());
  ops->FromHost(copy->data(), model.params(), model.num_params());
  return copy->data();
}

GptInference::GptInference(const Gpt& model, Ops* ops, Precision precision)
    : layout_(GptLayout::Whole(model.config())),
      ops_(ops),
      precision_(precision),
      memory_(&layout_, ops, ModelParamsOn(model, ops, &device_params_), /*grads=*/nullptr),
      narrowed_(precision == Precision::kFp32
                    ? nullptr
                    : std::make_unique<NarrowedParams>(&layout_, ops, precision, &memory_)),
      stage_(&layout_, ops, /*tp=*/nullptr, precision),
      acts_(&layout_, ops, precision) {}

float GptInference::Loss(const int32_t* inputs, const int32_t* targets, int B, int T,
                         float* losses) {
  DROVER_CHECK(targets != nullptr);
  DROVER_CHECK(B >= 1 && T >= 1 && T <= config().max_seq_len);
  acts_.Ensure(B, T);
  const size_t BT = static_cast<size_t>(B) * T;
  std::copy(inputs, inputs + BT, acts_.inputs());
  std::copy(targets, targets + BT, acts_.targets());
  StageMemory& memory = narrowed_ != nullptr ? static_cast<StageMemory&>(*narrowed_) : memory_;
  // One stage, no tensor parallelism and whole arenas: nothing in it can fail.
  auto loss = stage_.Forward(acts_, memory, GptStage::Pass::kEval);
  DROVER_CHECK_OK(loss.status());
  if (losses != nullptr) ops_->ToHost(losses, acts_.losses(), BT);
  return *loss;
}

}  // namespace drover::engine
