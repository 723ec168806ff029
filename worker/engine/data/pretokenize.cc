// GPT-2's pre-tokenizer, by hand (see tokenizer.h for the regex and the approximation).
#include <vector>

#include "worker/engine/data/tokenizer.h"
#include "worker/engine/data/utf8.h"

namespace drover::engine {
namespace {

enum class CharClass { kLetter, kNumber, kSpace, kOther };

bool IsSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 ||
         cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

CharClass Classify(uint32_t cp) {
  if (IsSpace(cp)) return CharClass::kSpace;
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
  if (cp >= '0' && cp <= '9') return CharClass::kNumber;
  if (cp < 0xA0) return CharClass::kOther;
  // Latin-1 supplement exactly as Unicode classes it.
  if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return CharClass::kLetter;
  if (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE)) {
    return CharClass::kNumber;
  }
  if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return CharClass::kOther;
  // The approximation: every other code point counts as a letter (U+FFFD, which stands in
  // for malformed bytes, included).
  return CharClass::kLetter;
}

struct Char {
  size_t begin;  // byte offset
  CharClass cls;
  uint32_t cp;
};

// GPT-2's contractions: 's 't 're 've 'm 'll 'd (case-sensitive, as in the original).
size_t ContractionLength(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char c = text[pos + 1];
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
  if (pos + 2 < text.size()) {
    const std::string_view two = text.substr(pos + 1, 2);
    if (two == "re" || two == "ve" || two == "ll") return 3;
  }
  return 0;
}

}  // namespace

std::vector<std::string_view> Gpt2PreTokenize(std::string_view text) {
  std::vector<Char> chars;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const uint32_t cp = utf8::DecodeAt(text, pos, &len);
    chars.push_back({pos, Classify(cp), cp});
    pos += len;
  }
  const size_t n = chars.size();
  auto byte_at = [&](size_t i) { return i < n ? chars[i].begin : text.size(); };
  std::vector<std::string_view> pieces;
  size_t i = 0;
  while (i < n) {
    size_t end = i;  // exclusive, in chars
    if (const size_t len = ContractionLength(text, chars[i].begin); len > 0) {
      end = i + len;  // contraction characters are ASCII: one byte each
    } else {
      // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional ASCII space, then a run.
      size_t start = i;
      if (chars[i].cp == ' ' && i + 1 < n && chars[i + 1].cls != CharClass::kSpace) start = i + 1;
      const CharClass cls = chars[start].cls;
      if (cls != CharClass::kSpace) {
        end = start;
        while (end < n && chars[end].cls == cls) ++end;
      } else {
        // `\s+(?!\S)`: a whitespace run, minus its last character when a non-space
        // follows (that character then leads the next piece); else `\s+`.
        end = i;
        while (end < n && chars[end].cls == CharClass::kSpace) ++end;
        if (end < n && end - i >= 2) --end;
      }
    }
    pieces.push_back(text.substr(byte_at(i), byte_at(end) - byte_at(i)));
    i = end;
  }
  return pieces;
}

}  // namespace drover::engine
