// Tokenizers: byte-level (token = byte, vocabulary 256) and GPT-2 BPE.
//
// GPT-2 BPE is loaded from OpenAI's two files: encoder.json (a flat JSON object mapping
// byte-to-unicode token strings to ids) and vocab.bpe (a "#version" line, then one merge
// "a b" per line, in rank order). Text is split by a hand-written equivalent of GPT-2's
// pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// where \p{L} is approximated by ASCII letters plus every code point >= U+00C0 except
// U+00D7 and U+00F7 (Latin-1 / Latin Extended letters and, approximately, the letters of
// other scripts), \p{N} by ASCII digits, and \s by ASCII whitespace plus U+0085 and U+00A0.
// For ASCII and Latin text this matches GPT-2 exactly; for other scripts, punctuation
// outside Latin-1 is treated as a letter, which changes splits (not the decode round trip).
//
// Thread-safety: Encode/Decode are const and may run concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace drover::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> Encode(std::string_view text) const = 0;
  // Concatenates the bytes of every token; an id outside the vocabulary decodes to "".
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;
  virtual int vocab_size() const = 0;
  // The end-of-text token, or -1 when the vocabulary has none.
  virtual int32_t eot_token() const = 0;
};

std::unique_ptr<Tokenizer> MakeByteTokenizer();

// NotFound / InvalidArgument naming the file and line (or JSON offset) on bad input.
StatusOr<std::unique_ptr<Tokenizer>> LoadGpt2Tokenizer(const std::string& encoder_json_path,
                                                       const std::string& merges_path);

// "byte" -> MakeByteTokenizer(); "gpt2" -> LoadGpt2Tokenizer(encoder, merges); anything
// else is InvalidArgument.
StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(const std::string& kind,
                                                   const std::string& encoder_json_path = "",
                                                   const std::string& merges_path = "");

// Splits text as GPT-2's pre-tokenizer does (see above). Exposed for tests.
std::vector<std::string_view> Gpt2PreTokenize(std::string_view text);

}  // namespace drover::engine
