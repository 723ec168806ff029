#include "worker/engine/data/tokenizer.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "common/files.h"
#include "worker/engine/data/utf8.h"

namespace drover::engine {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
  }
  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
    }
    return out;
  }
  int vocab_size() const override { return 256; }
  int32_t eot_token() const override { return -1; }
};

// GPT-2's reversible byte -> code point map: printable Latin-1 bytes map to themselves,
// the rest (controls, space, ...) to U+0100 onwards, so every token is printable text.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> map(256, 0);
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = direct[b] ? uint32_t(b) : next++;
  return map;
}

StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok())
    return text.status().WithContext(std::string("cannot read ") + what + " '" + path + "'");
  return text;
}

// encoder.json is one flat object of token string -> id. nlohmann-json throws on malformed
// text; the exception stops here and becomes a Status naming the file and nlohmann's
// byte offset, so nothing escapes into drover code.
StatusOr<std::unordered_map<std::string, int32_t>> ParseEncoderJson(const std::string& text,
                                                                    const std::string& path) {
  auto error = [&](const std::string& what) {
    return InvalidArgumentError("encoder file " + path + ": " + what);
  };
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return error(e.what());
  }
  if (!doc.is_object()) {
    return error(std::string("expected an object of token -> id, got ") + doc.type_name());
  }
  std::unordered_map<std::string, int32_t> out;
  out.reserve(doc.size());
  for (const auto& [key, value] : doc.items()) {
    if (!value.is_number_integer()) {
      return error("token '" + key + "' has id " + value.dump() + "; expected an integer");
    }
    // Non-negative integers parse as unsigned; anything signed here is below zero.
    if (!value.is_number_unsigned()) return error("token '" + key + "' has a negative id");
    if (value.get<uint64_t>() > uint64_t(INT32_MAX)) {
      return error("token '" + key + "' has id " + value.dump() + ", out of range");
    }
    // The decoder is a table indexed by id: an id far beyond the vocabulary (a fuzzed
    // 999999999) would allocate gigabytes. GPT-2 numbers its tokens 0..n-1.
    if (value.get<uint64_t>() >= doc.size()) {
      return error("token '" + key + "' has id " + value.dump() + ", not below the number of " +
                   "tokens (" + std::to_string(doc.size()) + "); ids must be 0..n-1");
    }
    out[key] = static_cast<int32_t>(value.get<uint64_t>());
  }
  return out;
}

class Gpt2Tokenizer : public Tokenizer {
 public:
  Gpt2Tokenizer(std::unordered_map<std::string, int32_t> encoder,
                std::unordered_map<std::string, int> ranks)
      : encoder_(std::move(encoder)), ranks_(std::move(ranks)) {
    const std::vector<uint32_t> byte_to_cp = ByteToCodePoint();
    std::unordered_map<uint32_t, uint8_t> cp_to_byte;
    for (int b = 0; b < 256; ++b) {
      byte_symbol_[b].clear();
      utf8::Append(byte_to_cp[b], &byte_symbol_[b]);
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
    int32_t max_id = -1;
    for (const auto& [token, id] : encoder_) max_id = std::max(max_id, id);
    vocab_size_ = max_id + 1;
    decoder_.resize(vocab_size_);
    for (const auto& [token, id] : encoder_) {
      // Token text -> raw bytes through the inverse byte map; special tokens such as
      // <|endoftext|> are plain printable ASCII and map to themselves.
      std::string bytes;
      for (size_t pos = 0; pos < token.size();) {
        size_t len = 0;
        const uint32_t cp = utf8::DecodeAt(token, pos, &len);
        auto it = cp_to_byte.find(cp);
        if (it != cp_to_byte.end()) {
          bytes.push_back(static_cast<char>(it->second));
        } else {
          bytes.append(token, pos, len);
        }
        pos += len;
      }
      decoder_[id] = std::move(bytes);
    }
    auto eot = encoder_.find("<|endoftext|>");
    eot_ = eot == encoder_.end() ? -1 : eot->second;
  }

  // Every byte must have a token, so that any text encodes (checked at load).
  std::string MissingByteSymbol() const {
    for (int b = 0; b < 256; ++b) {
      if (encoder_.find(byte_symbol_[b]) == encoder_.end()) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02X", b);
        return std::string("byte ") + hex + " ('" + byte_symbol_[b] + "')";
      }
    }
    return "";
  }

  std::vector<int32_t> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (std::string_view piece : Gpt2PreTokenize(text)) EncodePiece(piece, &ids);
    return ids;
  }

  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size_) out += decoder_[id];
    }
    return out;
  }
  int vocab_size() const override { return vocab_size_; }
  int32_t eot_token() const override { return eot_; }

 private:
  // Byte-pair merges by rank: repeatedly merge every occurrence of the adjacent pair with
  // the lowest merge rank, until no adjacent pair has one.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const {
    std::vector<std::string> word;
    word.reserve(piece.size());
    for (char c : piece) word.push_back(byte_symbol_[static_cast<uint8_t>(c)]);
    std::string key;
    while (word.size() > 1) {
      int best = INT_MAX;
      size_t best_at = 0;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        key.assign(word[i]).append(" ").append(word[i + 1]);
        auto it = ranks_.find(key);
        if (it != ranks_.end() && it->second < best) {
          best = it->second;
          best_at = i;
        }
      }
      if (best == INT_MAX) break;
      const std::string first = word[best_at];
      const std::string second = word[best_at + 1];
      std::vector<std::string> merged;
      merged.reserve(word.size());
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
          merged.push_back(first + second);
          i += 2;
        } else {
          merged.push_back(std::move(word[i]));
          i += 1;
        }
      }
      word = std::move(merged);
    }
    for (const std::string& symbol : word) {
      auto it = encoder_.find(symbol);
      if (it != encoder_.end()) {
        ids->push_back(it->second);
        continue;
      }
      // A merge whose result the vocabulary lacks: fall back to the symbol's bytes.
      for (size_t pos = 0; pos < symbol.size();) {
        size_t len = 0;
        utf8::DecodeAt(symbol, pos, &len);
        ids->push_back(encoder_.at(symbol.substr(pos, len)));
        pos += len;
      }
    }
  }

  std::unordered_map<std::string, int32_t> encoder_;
  std::unordered_map<std::string, int> ranks_;  // "a b" -> merge rank
  std::string byte_symbol_[256];
  std::vector<std::string> decoder_;  // id -> raw bytes
  int vocab_size_ = 0;
  int32_t eot_ = -1;
};

StatusOr<std::unordered_map<std::string, int>> ParseMerges(const std::string& text,
                                                           const std::string& path) {
  std::unordered_map<std::string, int> ranks;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return InvalidArgumentError("merges file " + path + " line " + std::to_string(line_no) +
                                  ": expected two symbols separated by one space, got '" + line +
                                  "'");
    }
    ranks.emplace(line, static_cast<int>(ranks.size()));
  }
  return ranks;
}

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json_path,
                                                       const std::string& merges_path) {
  ASSIGN_OR_RETURN(const std::string json, ReadFile(encoder_json_path, "encoder file"));
  ASSIGN_OR_RETURN(const std::string merges, ReadFile(merges_path, "merges file"));
  ASSIGN_OR_RETURN(auto encoder, ParseEncoderJson(json, encoder_json_path));
  ASSIGN_OR_RETURN(auto ranks, ParseMerges(merges, merges_path));
  auto tokenizer = std::make_unique<Gpt2Tokenizer>(std::move(encoder), std::move(ranks));
  if (const std::string missing = tokenizer->MissingByteSymbol(); !missing.empty()) {
    return InvalidArgumentError("encoder file " + encoder_json_path + " has no token for " +
                                missing + "; a GPT-2 vocabulary needs all 256 byte tokens");
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& kind,
                                                   const std::string& encoder_json_path,
                                                   const std::string& merges_path) {
  if (kind == "byte") return MakeByteTokenizer();
  if (kind == "gpt2") {
    if (encoder_json_path.empty() || merges_path.empty()) {
      return InvalidArgumentError(
          "the gpt2 tokenizer needs --encoder encoder.json and --merges vocab.bpe");
    }
    return LoadGpt2Tokenizer(encoder_json_path, merges_path);
  }
  return InvalidArgumentError("tokenizer '" + kind + "' is unknown; valid: byte | gpt2");
}

}  // namespace drover::engine
