// llm.c's GPT-2 model file, so models move between drover and llm.c / PyTorch tooling.
//
// Layout (little-endian): a header of 256 int32: [0] magic 20240326, [1] version 3 (fp32
// parameters, padded vocabulary), [2] max_seq_len, [3] vocab_size, [4] num_layers,
// [5] num_heads, [6] channels, [7] padded_vocab_size, the rest zero. Then every parameter
// as fp32 in llm.c's tensor-major order: wte (Vp, C), wpe (maxT, C), ln1w (L, C),
// ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C),
// ln2w (L, C), ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C),
// fcprojb (L, C), lnfw (C), lnfb (C). drover's arena is layer-major, so both functions
// permute between the two orders.
#pragma once

#include <memory>
#include <string>

#include "common/file_system.h"
#include "common/status.h"
#include "worker/engine/model/gpt.h"

namespace drover::engine {

inline constexpr int kModelFileMagic = 20240326;
inline constexpr int kModelFileVersionFp32 = 3;

// Writes `model`'s parameters to `path` with WriteFileAtomic: a crash leaves the old file or
// the new one, and a failed write leaves no temporary file. Errors name the path.
Status SaveModelFile(const Gpt& model, const std::string& path,
                     FileSystem* fs = FileSystem::Default());
// The same for a global parameter arena of `config` (GptTensorTable order), as a parallel
// job assembles it on rank 0.
Status SaveModelFile(const GptConfig& config, const float* params, const std::string& path,
                     FileSystem* fs = FileSystem::Default());

// Both readers below also take a Hugging Face GPT-2 safetensors file (hf_gpt2.h), told from
// an llm.c file by its first bytes, or a directory holding one as model.safetensors (what
// from_pretrained takes), and a drover checkpoint: a step_N/ directory, or a checkpoint
// directory for its newest usable one (ckpt/checkpoint_model.h). So every place that takes a
// model (train.init_from, drover sample, eval and export) takes any of them.

// Reads the header only. NotFound, DataLoss (short file, wrong magic), InvalidArgument
// (unsupported version, inconsistent shapes); messages name the file and the field.
StatusOr<GptConfig> ReadModelFileConfig(const std::string& path);

// Builds a model from `path`. Errors as ReadModelFileConfig, plus DataLoss when the file
// size does not match the header's shapes or a weight is not finite.
StatusOr<std::unique_ptr<Gpt>> LoadModelFile(const std::string& path);

}  // namespace drover::engine
