// A drover checkpoint as a model: what sample, eval, export and train.init_from take besides
// model files (model/model_file.h dispatches here), so that a run's model can be looked at
// at any checkpoint while it trains, not only once it wrote <output_dir>/model.bin.
//
// Only the parameters are read (ReadCheckpointPart: the AdamW moments, two thirds of a
// checkpoint, stay on disk), each block verified against its CRC32C as a resuming trainer
// verifies it.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "proto/drover.pb.h"
#include "worker/engine/model/gpt.h"

namespace drover::engine::ckpt {

// The model config a manifest records, and the record of one.
GptConfig ModelConfigOf(const v1::CheckpointModelConfig& p);
v1::CheckpointModelConfig ModelConfigProto(const GptConfig& c);

// True for a checkpoint's step directory (it holds manifest.json) or a checkpoint directory
// (it holds a complete step_N/).
bool IsCheckpointPath(const std::string& path);

// The model of step directory `path`, or of the newest usable checkpoint in checkpoint
// directory `path` (a broken newer one is skipped, with a warning, as a resume skips it);
// `chosen`, when given, receives the step directory read. DataLoss for a broken checkpoint
// (naming its file) or a manifest whose model and parameter count disagree; InvalidArgument
// for a model config that is no model (naming the field); FailedPrecondition when a
// directory holds checkpoints and none is usable.
StatusOr<GptConfig> ReadCheckpointModelConfig(const std::string& path);
StatusOr<std::unique_ptr<Gpt>> LoadCheckpointModel(const std::string& path,
                                                   std::string* chosen = nullptr);

}  // namespace drover::engine::ckpt
