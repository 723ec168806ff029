#include "worker/engine/ckpt/checkpoint_model.h"

#include <algorithm>

#include "common/files.h"
#include "worker/engine/ckpt/checkpoint.h"

namespace drover::engine::ckpt {
namespace {

// The manifest's model, checked before anything is sized by it: a config that validates,
// and as many parameters as it has.
StatusOr<GptConfig> CheckedConfig(const std::string& step_dir, const v1::CheckpointManifest& m) {
  const GptConfig c = ModelConfigOf(m.model());
  if (Status st = c.Validate(); !st.ok()) {
    return DataLossError("checkpoint " + step_dir + ": its model is no model: " + st.message());
  }
  // In closed form first: a fuzzed manifest of 458753 layers must not walk a table of them.
  const unsigned __int128 n = GptNumParamsWide(c);
  if (m.num_params() < 0 || static_cast<unsigned __int128>(m.num_params()) != n) {
    return DataLossError("checkpoint " + step_dir + " has " + std::to_string(m.num_params()) +
                         " parameters, which its model " + DescribeConfig(c) + " does not have");
  }
  return c;
}

}  // namespace

GptConfig ModelConfigOf(const v1::CheckpointModelConfig& p) {
  GptConfig c;
  c.max_seq_len = p.max_seq_len();
  c.vocab_size = p.vocab_size();
  c.padded_vocab_size = p.padded_vocab_size();
  c.num_layers = p.num_layers();
  c.num_heads = p.num_heads();
  c.channels = p.channels();
  return c;
}

v1::CheckpointModelConfig ModelConfigProto(const GptConfig& c) {
  v1::CheckpointModelConfig p;
  p.set_max_seq_len(c.max_seq_len);
  p.set_vocab_size(c.vocab_size);
  p.set_padded_vocab_size(c.padded_vocab_size);
  p.set_num_layers(c.num_layers);
  p.set_num_heads(c.num_heads);
  p.set_channels(c.channels);
  return p;
}

bool IsCheckpointPath(const std::string& path) {
  if (!IsDirectory(path)) return false;
  return PathExists(path + "/manifest.json") || !ListCheckpoints(path).empty();
}

StatusOr<GptConfig> ReadCheckpointModelConfig(const std::string& path) {
  std::string step_dir = path;
  if (!PathExists(path + "/manifest.json")) {
    const auto steps = ListCheckpoints(path);
    if (steps.empty()) return NotFoundError(path + " holds no checkpoint (step_N/)");
    step_dir = steps.front().second;  // the newest; LoadCheckpointModel may skip it
  }
  ASSIGN_OR_RETURN(const v1::CheckpointManifest m, ReadManifest(step_dir));
  return CheckedConfig(step_dir, m);
}

StatusOr<std::unique_ptr<Gpt>> LoadCheckpointModel(const std::string& path, std::string* chosen) {
  auto want = [](const std::string& step_dir,
                 const v1::CheckpointManifest& m) -> StatusOr<PartRequest> {
    ASSIGN_OR_RETURN(const GptConfig c, CheckedConfig(step_dir, m));
    PartRequest r;
    r.params = {{0, GptNumParams(c)}};
    return r;
  };
  std::string step_dir = path;
  auto read = [&]() -> StatusOr<CheckpointPart> {
    if (!PathExists(path + "/manifest.json"))
      return LoadLatestCheckpointPart(path, want, &step_dir);
    ASSIGN_OR_RETURN(const v1::CheckpointManifest m, ReadManifest(path));
    return ReadCheckpointPart(path, m.step(), want);
  };
  ASSIGN_OR_RETURN(CheckpointPart part, read());
  const GptConfig config = ModelConfigOf(part.meta.model());  // checked by `want`
  auto model = std::make_unique<Gpt>(config);
  std::vector<float> params = std::move(part.params).TakeValues();
  if (params.size() != model->num_params()) {
    return DataLossError("checkpoint " + step_dir + ": read " + std::to_string(params.size()) +
                         " parameters of " + std::to_string(model->num_params()));
  }
  std::copy(params.begin(), params.end(), model->params());
  if (chosen != nullptr) *chosen = step_dir;
  return model;
}

}  // namespace drover::engine::ckpt
