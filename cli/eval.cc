// `drover eval MODEL --data SHARDS`: mean loss of a model file on the first N consecutive
// (B, T) batches of token shards, formed as llm.c's loader forms them (engine::EvalLoader).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/exit_code.h"
#include "worker/engine/data/loader.h"
#include "worker/engine/data/token_dataset.h"
#include "worker/engine/model/model_file.h"
#include "worker/engine/threads.h"

namespace drover::cli {
namespace {

struct EvalFlags {
  std::string model_path;
  std::string data;
  int batches = 10;
  int batch = 4;
  int seq = 0;  // 0: min(64, the model's block size)
  int threads = 0;
};

int Usage(const std::string& msg) {
  std::fprintf(stderr, "drover eval: %s\n", msg.c_str());
  return kExitUsage;
}

// A file that cannot be used: 2 when it is the file's fault, 1 when the machine's.
int InputFailure(const std::string& what, const Status& st) {
  std::fprintf(stderr, "drover eval: %s%s\n", what.c_str(), st.message().c_str());
  return ExitCodeForInput(st);
}

int RunEval(const EvalFlags& f, bool json) {
  auto model = engine::LoadModelFile(f.model_path);
  if (!model.ok()) return InputFailure("", model.status());
  if (f.threads > 0) engine::SetNumThreads(f.threads);
  const engine::GptConfig& cfg = (*model)->config();
  const int T = f.seq > 0 ? f.seq : std::min(64, cfg.max_seq_len);
  if (T > cfg.max_seq_len) {
    return Usage("--seq " + std::to_string(T) + " exceeds the model's block size " +
                 std::to_string(cfg.max_seq_len));
  }
  auto data = engine::TokenDataset::Open(f.data, T);
  if (!data.ok()) return InputFailure("--data: ", data.status());
  std::shared_ptr<const engine::TokenDataset> dataset(std::move(data).value());
  auto loader = engine::EvalLoader::Create(dataset, f.batch, T, cfg.vocab_size);
  if (!loader.ok()) return InputFailure("--data: ", loader.status());
  if ((*loader)->num_batches() < f.batches) {
    return Usage("--batches " + std::to_string(f.batches) + ": the data holds only " +
                 std::to_string((*loader)->num_batches()) + " batches of " +
                 std::to_string(f.batch) + " x " + std::to_string(T) + " tokens");
  }
  std::vector<int32_t> inputs(static_cast<size_t>(f.batch) * T);
  std::vector<int32_t> targets(inputs.size());
  double sum = 0;
  for (int i = 0; i < f.batches; ++i) {
    if (Status st = (*loader)->Batch(i, inputs.data(), targets.data()); !st.ok()) {
      return InputFailure("--data: ", st);
    }
    sum += (*model)->Forward(inputs.data(), targets.data(), f.batch, T);
  }
  const double loss = sum / f.batches;
  if (json) {
    std::printf("{\"loss\":%.9g,\"batches\":%d,\"batch\":%d,\"seq\":%d,\"tokens\":%lld}\n", loss,
                f.batches, f.batch, T, static_cast<long long>(f.batches) * f.batch * T);
  } else {
    std::printf("loss %.6f over %d batches of %d x %d tokens\n", loss, f.batches, f.batch, T);
  }
  return kExitOk;
}

CommandRun SetupEval(CLI::App* app, GlobalOptions* globals) {
  auto f = std::make_shared<EvalFlags>();
  auto json = std::make_shared<bool>(false);
  app->add_option("model", f->model_path, "llm.c model file or HF GPT-2 model.safetensors")
      ->required();
  app->add_option("--data", f->data, "token shards (path or glob)")->required();
  app->add_option("--batches", f->batches, "batches to average (default 10)")
      ->check(CLI::PositiveNumber);
  app->add_option("--batch", f->batch, "sequences per batch B (default 4)")
      ->check(CLI::PositiveNumber);
  app->add_option("--seq", f->seq, "sequence length T (default min(64, block size))")
      ->check(CLI::PositiveNumber);
  app->add_option("--threads", f->threads, "CPU threads (default: all)");
  app->add_flag("--json", *json, "print one JSON object");
  return [f, json, globals] { return RunEval(*f, *json || globals->json); };
}

DROVER_REGISTER_COMMAND("eval", "Mean loss of a model file on token shards", SetupEval);

}  // namespace
}  // namespace drover::cli
