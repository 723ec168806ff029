#include "cli/tokenizer_flags.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/files.h"

namespace drover::cli {

void AddTokenizerOptions(CLI::App* app, TokenizerFlags* flags) {
  app->add_option("--tokenizer", flags->kind,
                  "byte | gpt2 (default: gpt2 when the model's directory holds vocab.json "
                  "and merges.txt, as the Hub's does; else byte)")
      ->check(CLI::IsMember({"byte", "gpt2"}));
  app->add_option("--encoder", flags->encoder,
                  "GPT-2 encoder.json or vocab.json (default: the one beside the model)");
  app->add_option("--merges", flags->merges,
                  "GPT-2 vocab.bpe or merges.txt (default: the one beside the model)");
}

StatusOr<std::unique_ptr<engine::Tokenizer>> TokenizerFor(const std::string& command,
                                                          const std::string& model_path,
                                                          TokenizerFlags f) {
  if (f.kind == "byte" || !f.encoder.empty() || !f.merges.empty()) {
    if (f.kind.empty()) f.kind = "gpt2";  // --encoder or --merges alone
    return engine::MakeTokenizer(f.kind, f.encoder, f.merges);
  }
  const std::string dir = IsDirectory(model_path) ? model_path : Dirname(model_path);
  const std::string vocab = dir + "/vocab.json", merges = dir + "/merges.txt";
  if (!PathExists(vocab) || !PathExists(merges)) {
    return engine::MakeTokenizer(f.kind.empty() ? "byte" : f.kind);
  }
  std::fprintf(stderr, "drover %s: GPT-2 tokenizer from %s and %s\n", command.c_str(),
               vocab.c_str(), merges.c_str());
  return engine::MakeTokenizer("gpt2", vocab, merges);
}

}  // namespace drover::cli
