// GptInference: a whole model's forward passes on the kernel table the caller picks (the
// CPU's, or the CUDA plugin's through CudaOps) in a run precision, for what only scores a
// model: `drover eval` (its loss on token shards, HellaSwag). Sampling is GptDecoder's.
//
// It reads the parameters of a host Gpt. On the CPU table it reads that model's own arena;
// on another it copies them once, at construction, into an arena of the table's memory (in
// fp32: the model files are fp32). A mixed-precision run reads them through NarrowedParams,
// as training does, so a bf16 eval loss here is the trainer's bf16 validation loss.
//
// Thread-safety: one thread at a time. The Gpt must outlive this and, on the CPU table, its
// parameters must not change while this is used.
#pragma once

#include <cstdint>
#include <memory>

#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/gpt.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/narrowed_params.h"
#include "worker/engine/model/stage_memory.h"

namespace drover::engine {

// The parameters of `model` where `ops` reads them: the model's own arena on the CPU table;
// on another, a copy in its memory, allocated into `copy` and filled from the host.
float* ModelParamsOn(const Gpt& model, Ops* ops, Buffer* copy);

class GptInference {
 public:
  // `ops` is not owned and lives as long as this (CpuOps(), CudaOps()).
  GptInference(const Gpt& model, Ops* ops, Precision precision = Precision::kFp32);
  GptInference(const GptInference&) = delete;
  GptInference& operator=(const GptInference&) = delete;

  const GptConfig& config() const { return layout_.config(); }
  Precision precision() const { return precision_; }
  const char* device() const { return ops_->name(); }

  // The mean cross-entropy of targets (B, T) after inputs (B, T), token ids in [0, V), with
  // 1 <= T <= maxT. With `losses` (host, B*T floats), also each position's own loss:
  // -log p(targets[b, t] | inputs[b, 0..t]), in fp32 whatever the precision. Activation
  // memory grows to the largest (B, T) asked for and is kept.
  float Loss(const int32_t* inputs, const int32_t* targets, int B, int T, float* losses = nullptr);

 private:
  GptLayout layout_;
  Ops* ops_;
  const Precision precision_;
  Buffer device_params_;  // the copy on a table other than the CPU's; empty there
  FlatStageMemory memory_;
  std::unique_ptr<NarrowedParams> narrowed_;  // mixed precision only
  GptStage stage_;
  StageActivations acts_;
};

}  // namespace drover::engine
