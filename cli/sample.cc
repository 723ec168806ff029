// `drover sample MODEL --prompt TEXT --tokens N`: generates text from a model file (llm.c, or a
// Hugging Face GPT-2 safetensors), through GptDecoder's key/value cache, on the CPU or, with
// --device cuda, on the GPU.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/exit_code.h"
#include "cli/tokenizer_flags.h"
#include "worker/engine/data/tokenizer.h"
#include "worker/engine/model/gpt_decoder.h"
#include "worker/engine/model/model_file.h"
#include "worker/engine/threads.h"

namespace drover::cli {
namespace {

struct SampleFlags {
  std::string model_path;
  std::string prompt;
  int tokens = 200;
  double temperature = 1.0;
  int top_k = 0;  // 0: all tokens
  uint64_t seed = 1337;
  TokenizerFlags tokenizer;
  int threads = 0;
  DeviceFlags device;
};

// Draws a token from `logits` (V,) at `temperature` among the top_k most likely ones.
int32_t SampleToken(std::vector<float> logits, double temperature, int top_k,
                    std::mt19937_64* rng) {
  const int V = static_cast<int>(logits.size());
  if (temperature <= 0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> ids(V);
  for (int i = 0; i < V; ++i) ids[i] = i;
  int k = (top_k > 0 && top_k < V) ? top_k : V;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const double max_logit = logits[ids[0]];
  std::vector<double> p(k);
  for (int i = 0; i < k; ++i) p[i] = std::exp((logits[ids[i]] - max_logit) / temperature);
  std::discrete_distribution<int> pick(p.begin(), p.end());
  return ids[pick(*rng)];
}

int RunSample(SampleFlags f) {
  if (f.tokens < 0) {
    std::fprintf(stderr, "drover sample: --tokens must be >= 0, got %d\n", f.tokens);
    return kExitUsage;
  }
  auto tok = TokenizerFor("sample", f.model_path, f.tokenizer);
  if (!tok.ok()) {
    std::fprintf(stderr, "drover sample: %s\n", tok.status().message().c_str());
    return ExitCodeForInput(tok.status());
  }
  auto ops = OpsFor(f.device);  // before the model: a machine that cannot run it fails fast
  if (!ops.ok()) {
    std::fprintf(stderr, "drover sample: %s\n", ops.status().message().c_str());
    return ExitCodeForInput(ops.status());
  }
  auto model = engine::LoadModelFile(f.model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "drover sample: %s\n", model.status().message().c_str());
    return ExitCodeForInput(model.status());
  }
  if (f.threads > 0) engine::SetNumThreads(f.threads);
  const int V = (*model)->config().vocab_size;
  std::vector<int32_t> context = (*tok)->Encode(f.prompt);
  if (context.empty()) {
    // Start from end-of-text when the vocabulary has one, else from a newline byte.
    const int32_t eot = (*tok)->eot_token();
    context.push_back(eot >= 0 ? eot : (*tok)->Encode("\n").front());
  }
  // A smaller model vocabulary than the tokenizer's is fine as long as the prompt fits.
  for (int32_t id : context) {
    if (id < 0 || id >= V) {
      std::fprintf(stderr,
                   "drover sample: the prompt has token %d, outside the model's vocabulary of "
                   "%d tokens (wrong --tokenizer?)\n",
                   id, V);
      return kExitUsage;
    }
  }
  std::mt19937_64 rng(f.seed);
  std::fputs(f.prompt.c_str(), stdout);
  // Each token extends the last window by one: the decoder runs that one token through the
  // layers against its key/value cache (until the context outgrows block_size).
  engine::GptDecoder decoder(**model, *ops);
  for (int i = 0; i < f.tokens; ++i) {
    std::vector<float> logits =
        decoder.NextTokenLogits(context.data(), static_cast<int>(context.size()));
    int32_t next = SampleToken(std::move(logits), f.temperature, f.top_k, &rng);
    context.push_back(next);
    const int32_t one[1] = {next};
    std::string text = (*tok)->Decode(one);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
  return kExitOk;
}

DROVER_REGISTER_COMMAND(
    "sample", "Generate text from a model file", [](CLI::App* app, GlobalOptions*) -> CommandRun {
      auto f = std::make_shared<SampleFlags>();
      app->add_option(
             "model", f->model_path,
             "llm.c model file (e.g. runs/NAME/model.bin), HF GPT-2 model.safetensors (or its "
             "directory), or a checkpoint (step_N/, or a checkpoint.dir for its newest)")
          ->required();
      app->add_option("--prompt", f->prompt, "text to continue (default: empty)");
      app->add_option("--tokens", f->tokens, "tokens to generate (default 200)");
      app->add_option("--temperature", f->temperature, "softmax temperature; 0 = greedy")
          ->check(CLI::NonNegativeNumber);
      app->add_option("--top-k", f->top_k, "sample among the k most likely tokens; 0 = all")
          ->check(CLI::NonNegativeNumber);
      app->add_option("--seed", f->seed, "random seed (default 1337)");
      AddTokenizerOptions(app, &f->tokenizer);
      app->add_option("--threads", f->threads, "CPU threads (default: all)");
      AddDeviceOptions(app, &f->device, /*with_precision=*/false);
      return [f] { return RunSample(*f); };
    });

}  // namespace
}  // namespace drover::cli
