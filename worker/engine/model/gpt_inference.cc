#include "worker/engine/model/gpt_inference.h"

#include <algorithm>

namespace drover::engine {
namespace {

// The CPU table reads the model's own arena; another copies it into its memory (into
// `copy`, allocated here) and reads that.
float* ParamsOn(const Gpt& model, Ops* ops, Buffer* copy) {
  // The arena is read, never written: there are no optimizer steps here, and FlatStageMemory
  // writes only the gradients, which a forward pass never asks for.
  if (ops == CpuOps()) return const_cast<float*>(model.params());
  *copy = ops->Allocate(model.num_params());
  ops->FromHost(copy->data(), model.params(), model.num_params());
  return copy->data();
}

}  // namespace

GptInference::GptInference(const Gpt& model, Ops* ops, Precision precision)
    : layout_(GptLayout::Whole(model.config())),
      ops_(ops),
      precision_(precision),
      memory_(&layout_, ops, ParamsOn(model, ops, &device_params_), /*grads=*/nullptr),
      narrowed_(precision == Precision::kFp32
                    ? nullptr
                    : std::make_unique<NarrowedParams>(&layout_, ops, precision, &memory_)),
      stage_(&layout_, ops, /*tp=*/nullptr, precision),
      acts_(&layout_, ops, precision) {}

float GptInference::Run(const int32_t* inputs, const int32_t* targets, int B, int T,
                        GptStage::Pass pass) {
  DROVER_CHECK(B >= 1 && T >= 1 && T <= config().max_seq_len);
  acts_.Ensure(B, T);
  const size_t BT = static_cast<size_t>(B) * T;
  std::copy(inputs, inputs + BT, acts_.inputs());
  if (targets != nullptr) std::copy(targets, targets + BT, acts_.targets());
  StageMemory& memory = narrowed_ != nullptr ? static_cast<StageMemory&>(*narrowed_) : memory_;
  // One stage, no tensor parallelism and whole arenas: nothing in it can fail.
  auto loss = stage_.Forward(acts_, memory, pass);
  DROVER_CHECK_OK(loss.status());
  return *loss;
}

float GptInference::Loss(const int32_t* inputs, const int32_t* targets, int B, int T,
                         float* losses) {
  DROVER_CHECK(targets != nullptr);
  const float loss = Run(inputs, targets, B, T, GptStage::Pass::kEval);
  if (losses != nullptr) ops_->ToHost(losses, acts_.losses(), static_cast<size_t>(B) * T);
  return loss;
}

std::vector<float> GptInference::NextTokenLogits(const int32_t* tokens, int n) {
  DROVER_CHECK(n >= 1);
  DROVER_CHECK(precision_ == Precision::kFp32);
  const int len = std::min(n, config().max_seq_len);
  Run(tokens + (n - len), nullptr, 1, len, GptStage::Pass::kLogits);
  std::vector<float> out(config().vocab_size);
  ops_->ToHost(out.data(),
               acts_.logits() + static_cast<size_t>(len - 1) * config().padded_vocab_size,
               out.size());
  return out;
}

}  // namespace drover::engine
