// The tokenizer options of the commands that turn text into a model's tokens (drover
// sample, drover eval --hellaswag), and the tokenizer they name.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "worker/engine/data/tokenizer.h"

namespace CLI {
class App;
}

namespace drover::cli {

struct TokenizerFlags {
  std::string kind;  // "": gpt2 when a Hub tokenizer lies beside the model, else byte
  std::string encoder;
  std::string merges;
};

// --tokenizer, --encoder, --merges.
void AddTokenizerOptions(CLI::App* app, TokenizerFlags* flags);

// The tokenizer `flags` name for the model at `model_path`. A Hugging Face GPT-2 directory
// holds its tokenizer beside the weights, as vocab.json (OpenAI's encoder.json) and
// merges.txt (vocab.bpe): without --tokenizer byte, --encoder or --merges, those are used,
// and "drover COMMAND: GPT-2 tokenizer from ..." says so on stderr. Errors as
// engine::MakeTokenizer's.
StatusOr<std::unique_ptr<engine::Tokenizer>> TokenizerFor(const std::string& command,
                                                          const std::string& model_path,
                                                          TokenizerFlags flags);

}  // namespace drover::cli
