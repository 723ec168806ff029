// drover-gpt-logits: drover's side of the model-interop tests (tests/tools/
// safetensors_check.py, hf_gpt2_check.py), which compare an exported model's forward in
// another implementation against drover's own.
//
//   drover-gpt-logits write OUT --layers L --heads NH --embd C --vocab V --block T --seed S
//     writes an llm.c model file whose every parameter (LayerNorm gains and all biases
//     included) is drawn uniformly from [-0.5, 0.5): unlike GPT-2's init (biases 0,
//     gains 1), a swapped or mis-transposed tensor then changes the logits.
//   drover-gpt-logits logits MODEL --tokens 1,2,3
//     prints {"vocab_size": V, "tokens": [...], "logits": [[V floats] per position]} from
//     Gpt::Forward on one sequence (B = 1), padding columns dropped.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "worker/engine/model/gpt.h"
#include "worker/engine/model/model_file.h"

namespace {

using drover::engine::Gpt;
using drover::engine::GptConfig;

int Write(const std::string& out, const GptConfig& c, uint64_t seed) {
  if (drover::Status s = c.Validate(); !s.ok()) {
    std::fprintf(stderr, "drover-gpt-logits: %s\n", s.message().c_str());
    return 2;
  }
  Gpt model(c);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (size_t i = 0; i < model.num_params(); ++i) model.params()[i] = u(rng);
  // wte's padded rows stay zero, as in every model drover trains.
  const auto* wte = model.FindTensor("wte");
  for (size_t i = static_cast<size_t>(c.vocab_size) * c.channels; i < wte->numel; ++i) {
    model.params()[wte->offset + i] = 0;
  }
  if (drover::Status s = drover::engine::SaveModelFile(model, out); !s.ok()) {
    std::fprintf(stderr, "drover-gpt-logits: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

int Logits(const std::string& path, const std::string& token_list) {
  auto model = drover::engine::LoadModelFile(path);
  if (!model.ok()) {
    std::fprintf(stderr, "drover-gpt-logits: %s\n", model.status().message().c_str());
    return 2;
  }
  const GptConfig& c = (*model)->config();
  std::vector<int32_t> tokens;
  std::stringstream ss(token_list);
  for (std::string item; std::getline(ss, item, ',');) {
    int t = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), t);
    if (ec != std::errc() || end != item.data() + item.size() || t < 0 || t >= c.vocab_size) {
      std::fprintf(stderr, "drover-gpt-logits: token '%s' is not an id in [0, %d)\n", item.c_str(),
                   c.vocab_size);
      return 2;
    }
    tokens.push_back(t);
  }
  const int T = static_cast<int>(tokens.size());
  if (T < 1 || T > c.max_seq_len) {
    std::fprintf(stderr, "drover-gpt-logits: need 1..%d tokens, got %d\n", c.max_seq_len, T);
    return 2;
  }
  (*model)->Forward(tokens.data(), nullptr, 1, T);
  const float* logits = (*model)->logits();  // (1, T, Vp)
  std::printf("{\"vocab_size\": %d, \"tokens\": [", c.vocab_size);
  for (int t = 0; t < T; ++t) std::printf("%s%d", t ? ", " : "", tokens[t]);
  std::printf("], \"logits\": [");
  for (int t = 0; t < T; ++t) {
    std::printf("%s[", t ? ", " : "");
    for (int v = 0; v < c.vocab_size; ++v) {
      std::printf("%s%.9g", v ? ", " : "",
                  logits[static_cast<size_t>(t) * c.padded_vocab_size + v]);
    }
    std::printf("]");
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"drover-gpt-logits: model files and logits for the interop tests"};
  app.require_subcommand(1);
  std::string out, model, tokens;
  int layers = 2, heads = 2, embd = 16, vocab = 64, block = 8;
  uint64_t seed = 1;
  CLI::App* write = app.add_subcommand("write", "write a model file with random parameters");
  write->add_option("out", out)->required();
  write->add_option("--layers", layers);
  write->add_option("--heads", heads);
  write->add_option("--embd", embd);
  write->add_option("--vocab", vocab);
  write->add_option("--block", block);
  write->add_option("--seed", seed);
  CLI::App* logits = app.add_subcommand("logits", "print the logits of one sequence as JSON");
  logits->add_option("model", model)->required();
  logits->add_option("--tokens", tokens, "comma-separated token ids")->required();
  CLI11_PARSE(app, argc, argv);
  if (write->parsed()) {
    GptConfig c;
    c.num_layers = layers;
    c.num_heads = heads;
    c.channels = embd;
    c.vocab_size = vocab;
    c.padded_vocab_size = drover::engine::PaddedVocabSize(vocab);
    c.max_seq_len = block;
    return Write(out, c, seed);
  }
  return Logits(model, tokens);
}
