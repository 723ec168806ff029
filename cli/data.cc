// `drover data prepare INPUT... --out DIR`: text files -> llm.c token shards.
//
// The inputs are concatenated in order and split by bytes: the last --val-fraction of the
// text becomes DIR/val.bin (as nanoGPT's shakespeare_char does), the rest
// DIR/train_000000.bin, train_000001.bin, ... of at most --shard-tokens tokens each. For
// the gpt2 tokenizer the split point moves back to a UTF-8 character boundary.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/exit_code.h"
#include "common/files.h"
#include "common/token_shard.h"
#include "worker/engine/data/tokenizer.h"

namespace drover::cli {
namespace {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out;
  std::string tokenizer = "byte";
  std::string encoder;
  std::string merges;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;
};

// A failure with its exit code: usage/invalid input (2) or runtime (1).
struct Failure {
  int code;
  std::string message;
};

StatusOr<std::string> ReadInputs(const std::vector<std::string>& paths) {
  std::string text;
  for (const std::string& path : paths) {
    StatusOr<std::string> one = ReadFileToString(path);
    if (!one.ok()) return one.status().WithContext("input file '" + path + "'");
    text += *one;
  }
  return text;
}

// Tokens as uint16, or InvalidArgument if an id does not fit the shard format.
StatusOr<std::vector<uint16_t>> Narrow(const std::vector<int32_t>& ids) {
  std::vector<uint16_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 65535) {
      return InvalidArgumentError("token id " + std::to_string(ids[i]) +
                                  " does not fit a uint16 token shard (ids must be <= 65535)");
    }
    out[i] = static_cast<uint16_t>(ids[i]);
  }
  return out;
}

// Writes train shards; returns how many.
StatusOr<int> WriteTrainShards(const std::string& dir, const std::vector<uint16_t>& tokens,
                               int64_t shard_tokens) {
  int shards = 0;
  for (size_t begin = 0; begin < tokens.size() || shards == 0; begin += size_t(shard_tokens)) {
    const size_t n = std::min(tokens.size() - begin, size_t(shard_tokens));
    char name[32];
    std::snprintf(name, sizeof(name), "train_%06d.bin", shards);
    RETURN_IF_ERROR(WriteTokenShard(dir + "/" + name, std::span(tokens.data() + begin, n)));
    ++shards;
    if (tokens.empty()) break;
  }
  return shards;
}

std::optional<Failure> Validate(const PrepareOptions& o) {
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    return Failure{kExitUsage, "--val-fraction " + std::to_string(o.val_fraction) +
                                   " is out of range; must be in [0, 1)"};
  }
  if (o.shard_tokens < 1 || o.shard_tokens > INT32_MAX) {
    return Failure{kExitUsage, "--shard-tokens " + std::to_string(o.shard_tokens) +
                                   " is out of range; must be in [1, 2147483647]"};
  }
  for (const std::string& path : o.inputs) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return Failure{kExitUsage, "input file '" + path + "' does not exist or is not a file"};
    }
  }
  return std::nullopt;
}

std::optional<Failure> Prepare(const PrepareOptions& o) {
  if (auto failure = Validate(o)) return failure;
  auto tokenizer = engine::MakeTokenizer(o.tokenizer, o.encoder, o.merges);
  if (!tokenizer.ok()) {
    return Failure{ExitCodeForInput(tokenizer.status()), tokenizer.status().message()};
  }
  auto text = ReadInputs(o.inputs);
  if (!text.ok()) return Failure{ExitCodeForInput(text.status()), text.status().message()};

  // nanoGPT's split: train = text[:int(n * (1 - F))], val = the rest.
  size_t split = static_cast<size_t>(double(text->size()) * (1.0 - o.val_fraction));
  // Keep multi-byte characters whole for the BPE tokenizer (bytes are bytes otherwise).
  if (o.tokenizer != "byte") {
    while (split > 0 && split < text->size() && (uint8_t((*text)[split]) & 0xC0) == 0x80) --split;
  }
  const std::string_view all(*text);
  auto train = Narrow((*tokenizer)->Encode(all.substr(0, split)));
  if (!train.ok()) return Failure{kExitUsage, train.status().message()};
  auto val = Narrow((*tokenizer)->Encode(all.substr(split)));
  if (!val.ok()) return Failure{kExitUsage, val.status().message()};

  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return Failure{kExitFailure, "cannot create --out '" + o.out + "': " + ec.message()};
  auto shards = WriteTrainShards(o.out, *train, o.shard_tokens);
  if (!shards.ok()) return Failure{kExitFailure, shards.status().message()};
  if (o.val_fraction > 0) {
    const Status st = WriteTokenShard(o.out + "/val.bin", *val);
    if (!st.ok()) return Failure{kExitFailure, st.message()};
  }
  std::printf("tokenizer %s (vocab %d): %zu bytes of text\n", o.tokenizer.c_str(),
              (*tokenizer)->vocab_size(), text->size());
  std::printf("train: %zu tokens in %d shard(s) %s/train_*.bin\n", train->size(), *shards,
              o.out.c_str());
  if (o.val_fraction > 0) {
    std::printf("val:   %zu tokens in %s/val.bin\n", val->size(), o.out.c_str());
  }
  return std::nullopt;
}

DROVER_REGISTER_COMMAND(
    "data", "Prepare token shards from text", [](CLI::App* app, GlobalOptions*) {
      app->require_subcommand(1);
      auto opts = std::make_shared<PrepareOptions>();
      CLI::App* prepare = app->add_subcommand(
          "prepare", "Tokenize text files into llm.c token shards (train_*.bin, val.bin)");
      prepare->add_option("inputs", opts->inputs, "text files, concatenated in order")->required();
      prepare->add_option("--out", opts->out, "output directory (created if missing)")->required();
      prepare->add_option("--tokenizer", opts->tokenizer, "byte | gpt2 (default byte)");
      prepare->add_option("--encoder", opts->encoder, "GPT-2 encoder.json (for --tokenizer gpt2)");
      prepare->add_option("--merges", opts->merges, "GPT-2 vocab.bpe (for --tokenizer gpt2)");
      prepare->add_option("--val-fraction", opts->val_fraction,
                          "fraction of the text, from its end, kept for val.bin (default 0.1)");
      prepare->add_option("--shard-tokens", opts->shard_tokens,
                          "most tokens per train shard (default 100000000)");
      return CommandRun([opts] {
        if (auto failure = Prepare(*opts)) {
          std::fprintf(stderr, "drover data prepare: %s\n", failure->message.c_str());
          return failure->code;
        }
        return static_cast<int>(kExitOk);
      });
    });

}  // namespace
}  // namespace drover::cli
