// Gpt: the whole GPT-2 model in one process, for everything that is not parallel training:
// `drover sample`, `drover eval`, llm.c model files, and the tests that pin the model
// against references. It is one GptStage over every layer (gpt_stage.h) with its own
// parameter and gradient arenas (the global layout of gpt_layout.h) and one set of
// activations, on the CPU kernel table.
//
// Parallel training composes GptStage, StageMemory and the parallel/ techniques instead
// (worker/engine/parallel/parallel_gpt.h); it never goes through this class.
//
// Thread-safety: a Gpt is used by one thread at a time; the kernels inside parallelise
// with OpenMP / OpenBLAS using the count set by engine::SetNumThreads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/stage_memory.h"

namespace drover::engine {

class Gpt {
 public:
  // Allocates the parameter and gradient arenas (zero-filled). CHECKs config.Validate().
  explicit Gpt(const GptConfig& config);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptConfig& config() const { return layout_.config(); }
  const GptLayout& layout() const { return layout_; }
  size_t num_params() const { return layout_.num_params(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  // The gradient arena. After ZeroGrad, the first call materialises the zeros (see there).
  float* grads();
  const float* grads() const;
  const std::vector<TensorInfo>& tensors() const { return layout_.global_tensors(); }
  // The entry named `name`, or nullptr.
  const TensorInfo* FindTensor(std::string_view name) const;
  // [begin, end) float offsets of layer l's parameters (ln1w .. fcprojb) in the arenas.
  std::pair<size_t, size_t> LayerRange(int l) const { return layout_.LayerRange(l); }

  // GPT-2 init (see InitGptParams).
  void InitRandom(uint64_t seed);

  // Runs the model on inputs (B, T) of token ids in [0, V). With targets (B, T), returns
  // the mean cross-entropy over B*T positions and prepares Backward (inputs and targets
  // are copied; the caller may reuse its buffers); with targets == nullptr returns 0 and
  // Backward may not follow. Requires 1 <= T <= maxT. Activation memory is allocated at
  // the first call and grown when a later (B, T) needs more. Token ids out of range are a
  // broken invariant (CHECK): validate data at its source.
  float Forward(const int32_t* inputs, const int32_t* targets, int B, int T);

  // Logits (B, T, Vp) of the last Forward; columns >= V are meaningless (padding). Valid
  // until Backward, which reuses the buffer for the logits' gradient.
  const float* logits() const { return acts_.logits(); }

  // Zeroes the gradients lazily: the next Backward overwrites them instead of adding, which
  // saves a pass over the whole arena and the re-read of it inside every weight GEMM.
  // grads() called before that Backward writes the zeros for real, so readers through
  // grads() always see zeros; a pointer kept from before ZeroGrad and read before the next
  // Backward does not (read the gradients after Backward, as every optimizer does).
  void ZeroGrad() { memory_.ZeroGrad(); }

  // Accumulates d(grad_scale * loss)/d(params) of the last Forward into grads(), so
  // gradient accumulation over k micro-batches is k x (Forward, Backward(1/k)).
  // CHECKs that a Forward with targets came right before.
  void Backward(float grad_scale = 1.0f);

  // Logits (V values, padding dropped) for the token that follows `tokens[0..n)`. Uses
  // the last min(n, maxT) tokens. For sampling; n >= 1.
  std::vector<float> NextTokenLogits(const int32_t* tokens, int n);

 private:
  GptLayout layout_;
  Ops* ops_;
  Buffer params_;
  Buffer grads_;
  mutable FlatStageMemory memory_;
  GptStage stage_;
  StageActivations acts_;
};

// GPT-2 init of a GLOBAL parameter arena (GptTensorTable order), deterministic from `seed`:
// weights ~ N(0, 0.02), attprojw and fcprojw ~ N(0, 0.02 / sqrt(2L)), biases 0, LayerNorm
// weights 1, padded wte rows 0. Normals come from SplitMix64 streams, one per (tensor,
// block of 65536 entries) keyed by the seed, through Box-Muller in double, so the result
// does not depend on the thread count. Parallel ranks init the global arena and keep their
// part (GptLayout::GlobalToLocal), so every mesh starts from the same model.
void InitGptParams(const GptConfig& config, uint64_t seed, float* params);

}  // namespace drover::engine
