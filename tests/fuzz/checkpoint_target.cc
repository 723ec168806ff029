#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <string>

#include "proto/drover.pb.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/targets.h"
#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/ckpt/checkpoint_model.h"

namespace drover::fuzz {

int FuzzCheckpoint(const uint8_t* data, size_t size) {
  const auto [manifest, shard] = SplitInput(data, size);
  const std::string step_dir = FreshScratchDir() + "/step_1";
  std::filesystem::create_directories(step_dir);
  WriteFileOrDie(step_dir + "/" + engine::ckpt::kManifestFile, manifest);
  // Give every shard the manifest names the same bytes, so that the readers get past
  // "missing shard" to sizes, CRCs and runs. Names that leave the directory are skipped:
  // the harness must not write outside its scratch space.
  v1::CheckpointManifest m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (google::protobuf::util::JsonStringToMessage(std::string(manifest), &m, options).ok()) {
    for (const auto& sh : m.shards()) {
      const std::string& f = sh.file();
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
          f.find('\0') != std::string::npos || f == engine::ckpt::kManifestFile) {
        continue;
      }
      WriteFileOrDie(step_dir + "/" + f, shard);
    }
  }
  (void)engine::ckpt::ReadManifest(step_dir);
  (void)engine::ckpt::CheckCheckpointShape(step_dir, 1);
  (void)engine::ckpt::ReadCheckpoint(step_dir);
  // As a model (drover sample/eval/export of a checkpoint): the step and its directory.
  (void)engine::ckpt::LoadCheckpointModel(step_dir);
  (void)engine::ckpt::LoadCheckpointModel(std::filesystem::path(step_dir).parent_path());
  return 0;
}

}  // namespace drover::fuzz
