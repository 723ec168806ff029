// `drover export MODEL --format safetensors [-o OUT]`: a model file as a Hugging Face GPT-2
// safetensors file (worker/engine/model/hf_gpt2.h has the names and the transposes).
// `--format hf [-o DIR]`: the same tensors as DIR/model.safetensors with DIR/config.json
// beside them, the directory `GPT2LMHeadModel.from_pretrained(DIR)` reads.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "cli/command.h"
#include "common/files.h"
#include "worker/engine/model/hf_gpt2.h"
#include "worker/engine/model/model_file.h"
#include "worker/engine/model/safetensors.h"

namespace drover::cli {
namespace {

struct ExportFlags {
  std::string model_path;
  std::string format = "safetensors";
  std::string dtype = "fp32";
  std::string out;  // empty: MODEL with its extension replaced by .safetensors, or by -hf
};

std::string DefaultOutput(const std::string& model_path, const std::string& suffix) {
  const size_t slash = model_path.find_last_of('/');
  const size_t dot = model_path.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (has_ext ? model_path.substr(0, dot) : model_path) + suffix;
}

int RunExport(const ExportFlags& f) {
  const bool hf_dir = f.format == "hf";
  if (f.format != "safetensors" && !hf_dir) {
    std::fprintf(stderr,
                 "drover export: --format '%s' is not supported (supported: safetensors, hf)\n",
                 f.format.c_str());
    return kExitUsage;
  }
  // What the tensors are stored as, and transformers' name for it (config.json).
  const std::map<std::string, std::pair<engine::SafetensorsDtype, std::string>> kDtypes = {
      {"fp32", {engine::SafetensorsDtype::kF32, "float32"}},
      {"bf16", {engine::SafetensorsDtype::kBF16, "bfloat16"}},
      {"fp16", {engine::SafetensorsDtype::kF16, "float16"}}};
  const auto dtype = kDtypes.at(f.dtype);  // CLI11 checked the name
  // A missing, short or foreign file is bad input (2), like in `drover eval`.
  auto model = engine::LoadModelFile(f.model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "drover export: %s\n", model.status().message().c_str());
    return kExitUsage;
  }
  const std::string target =
      !f.out.empty() ? f.out : DefaultOutput(f.model_path, hf_dir ? "-hf" : ".safetensors");
  if (!IsDirectory(Dirname(target))) {
    std::fprintf(stderr, "drover export: -o %s: directory %s does not exist\n", target.c_str(),
                 Dirname(target).c_str());
    return kExitUsage;
  }
  if (hf_dir && PathExists(target) && !IsDirectory(target)) {
    std::fprintf(stderr, "drover export: -o %s is a file; --format hf writes a directory\n",
                 target.c_str());
    return kExitUsage;
  }
  if (hf_dir) {
    if (Status st = MakeDirs(target); !st.ok()) {
      std::fprintf(stderr, "drover export: %s\n", st.message().c_str());
      return kExitFailure;
    }
  }
  const std::string out = hf_dir ? target + "/model.safetensors" : target;
  const auto tensors = engine::HfGpt2Tensors(**model);
  Status st = engine::WriteSafetensors(out, tensors, engine::HfGpt2Metadata((*model)->config()),
                                       FileSystem::Default(), dtype.first);
  if (st.ok() && hf_dir) {
    st = WriteFileAtomic(target + "/config.json",
                         engine::HfGpt2ConfigJson((*model)->config(), dtype.second));
  }
  if (!st.ok()) {
    std::fprintf(stderr, "drover export: writing %s: %s\n", target.c_str(), st.message().c_str());
    return kExitFailure;
  }
  std::printf("wrote %s (%zu tensors, HF GPT-2 names%s)\n", hf_dir ? target.c_str() : out.c_str(),
              tensors.size(), hf_dir ? "; model.safetensors and config.json" : "");
  return kExitOk;
}

CommandRun SetupExport(CLI::App* app, GlobalOptions*) {
  auto f = std::make_shared<ExportFlags>();
  app->add_option("model", f->model_path,
                  "llm.c model file (as `drover train` writes), HF GPT-2 model.safetensors (or its "
                  "directory), or a checkpoint (step_N/, or a checkpoint.dir for its newest)")
      ->required();
  app->add_option("--format", f->format,
                  "safetensors (one file) | hf (a directory for transformers' from_pretrained)")
      ->capture_default_str();
  app->add_option("--dtype", f->dtype,
                  "fp32 | bf16 | fp16: what the tensors are stored as (16-bit: half the size, "
                  "rounded to nearest even)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app->add_option("-o,--out", f->out,
                  "output file, or directory with --format hf (default: MODEL with .safetensors "
                  "or -hf)");
  return [f] { return RunExport(*f); };
}

DROVER_REGISTER_COMMAND("export", "Write a model file in another format (HF GPT-2 safetensors)",
                        SetupExport);

}  // namespace
}  // namespace drover::cli
