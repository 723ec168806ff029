// StageMemory: where a model stage reads its parameters and writes its gradients, one unit
// (gpt_layout.h) at a time. The stage says when it needs a unit and when it is done with
// it; the memory decides what that costs:
//   - FlatStageMemory (here): whole arenas; acquiring is a pointer into them.
//   - data parallelism wraps it and starts a bucket's all-reduce when its units' gradients
//     are ready (parallel/data_parallel.h);
//   - ZeRO-2/3 hand out transient gradient buffers and reduce-scatter them when ready, and
//     ZeRO-3 gathers a unit's parameters at acquisition and frees them at release
//     (parallel/zero.h).
//
// Protocol, per micro-batch, for each unit the stage touches:
//   AcquireParams(u) ... ReleaseParams(u)  -- counted: acquiring twice needs two releases;
//                                             the pointer stays valid until the last one;
//   AcquireGrads(u, &accumulate) ... GradsReady(u)  -- the first acquisition of a unit in a
//       micro-batch may say accumulate = false: the stage then overwrites the gradient
//       (or zero-fills the parts it only adds to) instead of adding to it; later
//       acquisitions before GradsReady say true. GradsReady: the unit's gradient for this
//       micro-batch is final.
// PrefetchParams(u) is a hint that u is acquired next; it never fails (an error shows at
// the acquisition).
//
// The embedding's backward goes through AddEmbeddingGrads. On a single stage the LM head
// shares the embedding unit. Where the memory says TiedUnitReadyAfterHead, the stage makes
// that unit ready right after the head's backward, before the layers': the unit's dense
// part (the head's gradient of wte, a third of GPT-2 small) can then be reduced while the
// layers' backward runs, instead of last. The embedding's own contribution arrives after
// that, as AddEmbeddingGrads; a memory whose reduction of the unit has already started
// reduces those rows on their own (B*T token rows and T position rows, not the whole table)
// and adds them after. Otherwise, and elsewhere (the first of several stages),
// AddEmbeddingGrads comes between AcquireGrads and GradsReady.
//
// Thread-safety: called from the training thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt_layout.h"

namespace drover::engine {

class StageMemory {
 public:
  virtual ~StageMemory() = default;
  // The unit's parameters, laid out as layout.units()[unit] (offsets from its start).
  virtual StatusOr<const float*> AcquireParams(int unit) = 0;
  virtual Status ReleaseParams(int unit) = 0;
  virtual void PrefetchParams(int /*unit*/) {}
  virtual StatusOr<float*> AcquireGrads(int unit, bool* accumulate) = 0;
  virtual Status GradsReady(int unit) = 0;
  // Adds the embedding's backward of a micro-batch into `unit` (the embedding unit): dout
  // (B, T, C) scatter-added into the wte rows of `inputs` (B, T), and summed over B into the
  // wpe rows 0..T-1 (Ops::EncoderBackward). See above for when it comes.
  virtual Status AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout, int B,
                                   int T) = 0;
  // Whether a single stage makes the unit the LM head shares with the embedding ready right
  // after the head's backward (true) or only after the embedding's (false). See above.
  virtual bool TiedUnitReadyAfterHead() const { return true; }
};

// Whole parameter and gradient arenas of one layout (not owned). ZeroGrad is lazy: the
// next micro-batch overwrites each unit's gradient instead of adding to it, which saves a
// pass over the arena and the re-read of it inside every weight GEMM.
class FlatStageMemory : public StageMemory {
 public:
  FlatStageMemory(const GptLayout* layout, Ops* ops, float* params, float* grads);

  StatusOr<const float*> AcquireParams(int unit) override;
  Status ReleaseParams(int unit) override;
  StatusOr<float*> AcquireGrads(int unit, bool* accumulate) override;
  Status GradsReady(int unit) override;
  Status AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout, int B,
                           int T) override;

  // The next AcquireGrads of every unit says accumulate = false.
  void ZeroGrad();
  // Writes the zeros ZeroGrad promised into every unit not yet overwritten, so that the
  // gradient arena reads as zeros (or as what backward accumulated since).
  void MaterializeZeros();

  float* params() { return params_; }
  float* grads() { return grads_; }
  const GptLayout& layout() const { return *layout_; }

 private:
  const GptLayout* layout_;
  Ops* ops_;
  float* params_;
  float* grads_;
  std::vector<bool> zero_pending_;  // per unit
};

}  // namespace drover::engine
