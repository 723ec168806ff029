// Sampling speed: drover's key/value-cached decoder (`drover sample`, GptDecoder) against
// recomputing the window for every token (Gpt::NextTokenLogits, what `drover sample` did
// before), on a random model of GPT-2 124M shapes by default, in the same run. With
// --device cuda, the decoder on the GPU (`drover sample --device cuda`) against the CPU's.
//
// Two cases, each generating --tokens greedily after a --prompt-token prompt:
//   inside the window: prompt + tokens <= block size, so every token extends the cache;
//   sliding: the prompt already fills the block, so every token shifts the window (absolute
//     positions) and the decoder recomputes it too, computing one row of logits, not T.
// Prints tokens/s of each and the ratio, and whether both chose the same tokens (on the GPU
// the logits differ from the CPU's in their last bits: a near tie may go the other way).
// Usage:
//   bench_sample_bench [--threads 2] [--prompt 64] [--tokens 32] [--device cpu|cuda]
//                      [--layers 12 --heads 12 --channels 768 --vocab 50257 --max-seq 1024]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "worker/engine/kernels/cuda_backend.h"
#include "worker/engine/model/gpt.h"
#include "worker/engine/model/gpt_decoder.h"
#include "worker/engine/threads.h"

namespace drover::engine {
namespace {

using Clock = std::chrono::steady_clock;

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Generates `tokens` greedily after `prompt` with `next`; returns tokens/s and the tokens.
template <typename Next>
double Generate(std::vector<int32_t> context, int tokens, Next next, std::vector<int32_t>* chosen) {
  const auto t0 = Clock::now();
  for (int i = 0; i < tokens; ++i) {
    const int32_t t = Argmax(next(context));
    context.push_back(t);
    chosen->push_back(t);
  }
  return tokens / std::chrono::duration<double>(Clock::now() - t0).count();
}

// `device` null: the CPU's decoder against recomputing the window; else the decoder on that
// table against the CPU's decoder.
void RunCase(const char* name, Gpt& model, int prompt_tokens, int tokens, Ops* device) {
  std::vector<int32_t> prompt(prompt_tokens);
  for (int i = 0; i < prompt_tokens; ++i) prompt[i] = (i * 7919 + 11) % model.config().vocab_size;
  std::vector<int32_t> base_tokens, cached_tokens;
  GptDecoder cpu(model);
  const double base = Generate(
      prompt, tokens,
      [&](const std::vector<int32_t>& c) {
        const int n = static_cast<int>(c.size());
        return device == nullptr ? model.NextTokenLogits(c.data(), n)
                                 : cpu.NextTokenLogits(c.data(), n);
      },
      &base_tokens);
  GptDecoder decoder(model, device != nullptr ? device : CpuOps());
  const double cached = Generate(
      prompt, tokens,
      [&](const std::vector<int32_t>& c) {
        return decoder.NextTokenLogits(c.data(), static_cast<int>(c.size()));
      },
      &cached_tokens);
  std::printf(
      "%-18s prompt %5d  tokens %4d  %s %8.2f tok/s  %s %8.2f tok/s  x%.1f  same tokens: %s\n",
      name, prompt_tokens, tokens, device == nullptr ? "recompute" : "cpu cached", base,
      device == nullptr ? "cached" : "gpu cached", cached, cached / base,
      base_tokens == cached_tokens ? "yes" : "NO");
}

}  // namespace
}  // namespace drover::engine

int main(int argc, char** argv) {
  using namespace drover::engine;
  CLI::App app{"drover sampling benchmark"};
  int threads = 2, prompt = 64, tokens = 32;
  int layers = 12, heads = 12, channels = 768, vocab = 50257, max_seq = 1024;
  std::string device_name = "cpu";
  app.add_option("--threads", threads);
  app.add_option("--prompt", prompt);
  app.add_option("--tokens", tokens);
  app.add_option("--layers", layers);
  app.add_option("--heads", heads);
  app.add_option("--channels", channels);
  app.add_option("--vocab", vocab);
  app.add_option("--max-seq", max_seq);
  app.add_option("--device", device_name)->check(CLI::IsMember({"cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  SetNumThreads(threads);
  Ops* device = nullptr;
  if (device_name == "cuda") {
    auto ops = CudaOps();
    if (!ops.ok()) {
      std::fprintf(stderr, "bench_sample_bench: %s\n", ops.status().message().c_str());
      return 2;
    }
    device = *ops;
  }
  GptConfig config{max_seq, vocab, PaddedVocabSize(vocab), layers, heads, channels};
  Gpt model(config);
  model.InitRandom(1);
  std::printf("GPT L=%d NH=%d C=%d maxT=%d V=%d, %d threads, %s\n", layers, heads, channels,
              max_seq, vocab, threads, device_name.c_str());
  RunCase("inside the window", model, std::min(prompt, max_seq - tokens), tokens, device);
  RunCase("sliding", model, max_seq, std::max(1, tokens / 8), device);
  return 0;
}
