// `drover data prepare INPUT... --out DIR`: text files -> llm.c token shards.
//
// The inputs are concatenated in order and split by bytes: the last --val-fraction of the
// text becomes DIR/val.bin (as nanoGPT's shakespeare_char does), the rest
// DIR/train_000000.bin, train_000001.bin, ... of at most --shard-tokens tokens each. For
// the gpt2 tokenizer the split point moves back to a UTF-8 character boundary.
//
// JSON lines inputs (*.jsonl: one document a line, its text in --text-field, as FineWeb,
// OpenWebText and most corpora ship) are streamed instead, a document at a time, so that a
// corpus larger than memory can be prepared: each document is tokenized with the end-of-text
// token before it (GPT-2's <|endoftext|>, as llm.c's fineweb.py does; the byte tokenizer
// has none, and joins documents as they are) on every core, a batch of about 16 MB of text
// at a time, train shards are written as they fill, and
// the documents that start in the last --val-fraction of the input bytes go to val.bin
// (held in memory until the end: a tenth of the corpus at the default).
//
// `drover data hellaswag FILE.jsonl --out FILE.bin`: HellaSwag's examples (or any benchmark
// of its shape: eval/hellaswag.h) tokenized, for a job's data.hellaswag, whose trainer scores
// them as it trains and has no tokenizer.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "cli/exit_code.h"
#include "common/files.h"
#include "common/token_shard.h"
#include "worker/engine/data/tokenizer.h"
#include "worker/engine/eval/hellaswag.h"

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
  std::string text_field = "text";  // of a JSON lines document
  int threads = 0;                  // tokenizing JSON lines documents; 0: every core
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

bool IsJsonLines(const std::string& path) {
  return path.size() > 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
}

// Train shards written as they fill: every one --shard-tokens long but the last.
class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t shard_tokens)
      : dir_(std::move(dir)), shard_tokens_(static_cast<size_t>(shard_tokens)) {}

  Status Add(const std::vector<uint16_t>& tokens) {
    size_t at = 0;
    while (at < tokens.size()) {
      const size_t n = std::min(tokens.size() - at, shard_tokens_ - pending_.size());
      pending_.insert(pending_.end(), tokens.begin() + at, tokens.begin() + at + n);
      at += n;
      if (pending_.size() == shard_tokens_) RETURN_IF_ERROR(Flush());
    }
    return OkStatus();
  }
  // Writes what is pending (and an empty shard when nothing was written at all).
  Status Finish() { return pending_.empty() && shards_ > 0 ? OkStatus() : Flush(); }
  int shards() const { return shards_; }
  size_t tokens() const { return tokens_; }

 private:
  Status Flush() {
    char name[32];
    std::snprintf(name, sizeof(name), "train_%06d.bin", shards_);
    RETURN_IF_ERROR(WriteTokenShard(dir_ + "/" + name, pending_));
    ++shards_;
    tokens_ += pending_.size();
    pending_.clear();
    return OkStatus();
  }

  const std::string dir_;
  const size_t shard_tokens_;
  std::vector<uint16_t> pending_;
  int shards_ = 0;
  size_t tokens_ = 0;
};

// One document read and not yet tokenized.
struct Document {
  std::string text;
  bool val = false;   // starts in the last --val-fraction of the input bytes
  std::string where;  // "FILE:LINE: ", for errors
};

// Tokenizes `docs` on up to `threads` threads (GPT-2's BPE is the slow part of preparing a
// corpus; documents are independent), each with the end-of-text token `eot` (< 0: none)
// first; results in document order.
std::vector<std::vector<int32_t>> TokenizeBatch(const std::vector<Document>& docs,
                                                const engine::Tokenizer& tok, int32_t eot,
                                                int threads) {
  std::vector<std::vector<int32_t>> out(docs.size());
  auto work = [&](size_t first) {
    for (size_t i = first; i < docs.size(); i += static_cast<size_t>(threads)) {
      if (eot >= 0) out[i].push_back(eot);
      const std::vector<int32_t> ids = tok.Encode(docs[i].text);
      out[i].insert(out[i].end(), ids.begin(), ids.end());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, static_cast<size_t>(t));
  work(0);
  for (std::thread& t : pool) t.join();
  return out;
}

// The JSON lines path (see the top of this file).
std::optional<Failure> PrepareJsonLines(const PrepareOptions& o, const engine::Tokenizer& tok) {
  uint64_t total_bytes = 0;
  for (const std::string& path : o.inputs) {
    std::error_code ec;
    total_bytes += std::filesystem::file_size(path, ec);
  }
  const auto val_from = static_cast<uint64_t>(double(total_bytes) * (1.0 - o.val_fraction));
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return Failure{kExitFailure, "cannot create --out '" + o.out + "': " + ec.message()};
  ShardWriter train(o.out, o.shard_tokens);
  std::vector<uint16_t> val;
  int64_t documents = 0;
  // Documents are read in batches of about 16 MB of text, tokenized together, then written
  // in order: memory stays bounded by a batch and a shard.
  constexpr size_t kBatchBytes = 16 << 20;
  std::vector<Document> batch;
  size_t batch_bytes = 0;
  auto flush = [&]() -> std::optional<Failure> {
    const std::vector<std::vector<int32_t>> ids =
        TokenizeBatch(batch, tok, tok.eot_token(), threads);
    for (size_t i = 0; i < batch.size(); ++i) {
      auto tokens = Narrow(ids[i]);
      if (!tokens.ok()) return Failure{kExitUsage, batch[i].where + tokens.status().message()};
      if (batch[i].val) {
        val.insert(val.end(), tokens->begin(), tokens->end());
      } else if (Status st = train.Add(*tokens); !st.ok()) {
        return Failure{kExitFailure, st.message()};
      }
    }
    documents += static_cast<int64_t>(batch.size());
    batch.clear();
    batch_bytes = 0;
    return std::nullopt;
  };
  uint64_t offset = 0;  // of the line being read, over all inputs
  for (const std::string& path : o.inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Failure{kExitFailure, "cannot open input file '" + path + "'"};
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      const uint64_t starts_at = offset;
      offset += line.size() + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      std::string where = path + ":" + std::to_string(number) + ": ";
      nlohmann::json doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (doc.is_discarded() || !doc.is_object()) {
        return Failure{kExitUsage, where + "not a JSON object"};
      }
      auto field = doc.find(o.text_field);
      if (field == doc.end() || !field->is_string()) {
        return Failure{kExitUsage, where + "no string \"" + o.text_field +
                                       "\" (--text-field names the key that holds the text)"};
      }
      const bool to_val = o.val_fraction > 0 && starts_at >= val_from;
      batch.push_back({std::move(field->get_ref<std::string&>()), to_val, std::move(where)});
      batch_bytes += batch.back().text.size();
      if (batch_bytes >= kBatchBytes) {
        if (auto failure = flush()) return failure;
      }
    }
    if (in.bad()) return Failure{kExitFailure, "reading input file '" + path + "' failed"};
  }
  if (auto failure = flush()) return failure;
  if (Status st = train.Finish(); !st.ok()) return Failure{kExitFailure, st.message()};
  if (o.val_fraction > 0) {
    if (Status st = WriteTokenShard(o.out + "/val.bin", val); !st.ok()) {
      return Failure{kExitFailure, st.message()};
    }
  }
  std::printf("tokenizer %s (vocab %d): %lld documents, %llu bytes of JSON lines\n",
              o.tokenizer.c_str(), tok.vocab_size(), static_cast<long long>(documents),
              static_cast<unsigned long long>(total_bytes));
  std::printf("train: %zu tokens in %d shard(s) %s/train_*.bin\n", train.tokens(), train.shards(),
              o.out.c_str());
  if (o.val_fraction > 0) {
    std::printf("val:   %zu tokens in %s/val.bin\n", val.size(), o.out.c_str());
  }
  return std::nullopt;
}

std::optional<Failure> Prepare(const PrepareOptions& o) {
  if (auto failure = Validate(o)) return failure;
  auto tokenizer = engine::MakeTokenizer(o.tokenizer, o.encoder, o.merges);
  if (!tokenizer.ok()) {
    return Failure{ExitCodeForInput(tokenizer.status()), tokenizer.status().message()};
  }
  const auto jsonl = std::count_if(o.inputs.begin(), o.inputs.end(), IsJsonLines);
  if (jsonl > 0 && jsonl < static_cast<int64_t>(o.inputs.size())) {
    return Failure{kExitUsage,
                   "the inputs mix JSON lines (*.jsonl) and text files; prepare each kind on "
                   "its own"};
  }
  if (jsonl > 0) return PrepareJsonLines(o, **tokenizer);
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
  ShardWriter shards(o.out, o.shard_tokens);
  Status written = shards.Add(*train);
  if (written.ok()) written = shards.Finish();
  if (!written.ok()) return Failure{kExitFailure, written.message()};
  if (o.val_fraction > 0) {
    const Status st = WriteTokenShard(o.out + "/val.bin", *val);
    if (!st.ok()) return Failure{kExitFailure, st.message()};
  }
  std::printf("tokenizer %s (vocab %d): %zu bytes of text\n", o.tokenizer.c_str(),
              (*tokenizer)->vocab_size(), text->size());
  std::printf("train: %zu tokens in %d shard(s) %s/train_*.bin\n", shards.tokens(), shards.shards(),
              o.out.c_str());
  if (o.val_fraction > 0) {
    std::printf("val:   %zu tokens in %s/val.bin\n", val->size(), o.out.c_str());
  }
  return std::nullopt;
}

struct HellaswagOptions {
  std::string input, out;
  std::string tokenizer = "byte";
  std::string encoder, merges;
  int limit = 0;
};

int PrepareHellaswag(const HellaswagOptions& o) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "drover data hellaswag: %s\n", st.message().c_str());
    return ExitCodeForInput(st);
  };
  if (o.limit < 0) return fail(InvalidArgumentError("--limit must be >= 0"));
  auto tokenizer = engine::MakeTokenizer(o.tokenizer, o.encoder, o.merges);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  auto examples = engine::ReadChoiceExamples(o.input, **tokenizer, o.limit);
  if (!examples.ok()) return fail(examples.status());
  if (Status st = engine::WriteChoiceFile(o.out, *examples); !st.ok()) return fail(st);
  size_t endings = 0, tokens = 0;
  for (const engine::ChoiceExample& ex : *examples) {
    endings += ex.endings.size();
    tokens += ex.context.size();
    for (const auto& end : ex.endings) tokens += end.size();
  }
  std::printf("hellaswag: %zu examples, %zu endings, %zu tokens (%s) in %s\n", examples->size(),
              endings, tokens, o.tokenizer.c_str(), o.out.c_str());
  return kExitOk;
}

DROVER_REGISTER_COMMAND(
    "data", "Prepare token shards from text", [](CLI::App* app, GlobalOptions*) {
      app->require_subcommand(1);
      auto opts = std::make_shared<PrepareOptions>();
      CLI::App* prepare = app->add_subcommand(
          "prepare",
          "Tokenize text files or JSON lines documents into llm.c token shards (train_*.bin, "
          "val.bin)");
      prepare
          ->add_option("inputs", opts->inputs,
                       "text files, concatenated in order; or JSON lines files (*.jsonl), "
                       "one document a line, streamed")
          ->required();
      prepare->add_option("--text-field", opts->text_field,
                          "the key of a JSON lines document that holds its text (default text)");
      prepare
          ->add_option("--threads", opts->threads,
                       "threads tokenizing JSON lines documents (default: every core)")
          ->check(CLI::NonNegativeNumber);
      prepare->add_option("--out", opts->out, "output directory (created if missing)")->required();
      prepare->add_option("--tokenizer", opts->tokenizer, "byte | gpt2 (default byte)");
      prepare->add_option("--encoder", opts->encoder, "GPT-2 encoder.json (for --tokenizer gpt2)");
      prepare->add_option("--merges", opts->merges, "GPT-2 vocab.bpe (for --tokenizer gpt2)");
      prepare->add_option("--val-fraction", opts->val_fraction,
                          "fraction of the text, from its end, kept for val.bin (default 0.1)");
      prepare->add_option("--shard-tokens", opts->shard_tokens,
                          "most tokens per train shard (default 100000000)");
      auto hs = std::make_shared<HellaswagOptions>();
      CLI::App* hellaswag = app->add_subcommand(
          "hellaswag",
          "Tokenize a HellaSwag-style JSON lines file (ctx, endings, label) for a job's "
          "data.hellaswag, scored as it trains");
      hellaswag->add_option("input", hs->input, "the JSON lines file (hellaswag_val.jsonl)")
          ->required();
      hellaswag->add_option("--out", hs->out, "the file to write")->required();
      hellaswag->add_option("--tokenizer", hs->tokenizer, "byte | gpt2 (default byte)");
      hellaswag->add_option("--encoder", hs->encoder, "GPT-2 encoder.json (for --tokenizer gpt2)");
      hellaswag->add_option("--merges", hs->merges, "GPT-2 vocab.bpe (for --tokenizer gpt2)");
      hellaswag->add_option("--limit", hs->limit, "the first N examples only (default: all)");
      return CommandRun([opts, hs, hellaswag] {
        if (hellaswag->parsed()) return PrepareHellaswag(*hs);
        if (auto failure = Prepare(*opts)) {
          std::fprintf(stderr, "drover data prepare: %s\n", failure->message.c_str());
          return failure->code;
        }
        return static_cast<int>(kExitOk);
      });
    });

}  // namespace
}  // namespace drover::cli
