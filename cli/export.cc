// `drover export MODEL --format safetensors [-o OUT]`: an llm.c model file as a Hugging Face
// GPT-2 safetensors file (worker/engine/model/hf_gpt2.h has the names and the transposes).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

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
  std::string out;  // empty: MODEL with its extension replaced by .safetensors
};

std::string DefaultOutput(const std::string& model_path) {
  const size_t slash = model_path.find_last_of('/');
  const size_t dot = model_path.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (has_ext ? model_path.substr(0, dot) : model_path) + ".safetensors";
}

int RunExport(const ExportFlags& f) {
  if (f.format != "safetensors") {
    std::fprintf(stderr, "drover export: --format '%s' is not supported (supported: safetensors)\n",
                 f.format.c_str());
    return kExitUsage;
  }
  // A missing, short or foreign file is bad input (2), like in `drover eval`.
  if (IsDirectory(f.model_path)) {
    std::fprintf(stderr, "drover export: %s is a directory, not a model file\n",
                 f.model_path.c_str());
    return kExitUsage;
  }
  auto model = engine::LoadModelFile(f.model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "drover export: %s\n", model.status().message().c_str());
    return kExitUsage;
  }
  const std::string out = f.out.empty() ? DefaultOutput(f.model_path) : f.out;
  if (!IsDirectory(Dirname(out))) {
    std::fprintf(stderr, "drover export: -o %s: directory %s does not exist\n", out.c_str(),
                 Dirname(out).c_str());
    return kExitUsage;
  }
  const auto tensors = engine::HfGpt2Tensors(**model);
  Status st = engine::WriteSafetensors(out, tensors, engine::HfGpt2Metadata((*model)->config()));
  if (!st.ok()) {
    std::fprintf(stderr, "drover export: writing %s: %s\n", out.c_str(), st.message().c_str());
    return kExitFailure;
  }
  std::printf("wrote %s (%zu tensors, HF GPT-2 names)\n", out.c_str(), tensors.size());
  return kExitOk;
}

CommandRun SetupExport(CLI::App* app, GlobalOptions*) {
  auto f = std::make_shared<ExportFlags>();
  app->add_option("model", f->model_path,
                  "llm.c model file (as `drover train` writes) or HF GPT-2 safetensors")
      ->required();
  app->add_option("--format", f->format, "output format (safetensors)")->capture_default_str();
  app->add_option("-o,--out", f->out, "output file (default: MODEL with .safetensors)");
  return [f] { return RunExport(*f); };
}

DROVER_REGISTER_COMMAND("export", "Write a model file in another format (HF GPT-2 safetensors)",
                        SetupExport);

}  // namespace
}  // namespace drover::cli
