// A small GPT-2 vocabulary for tests, written as OpenAI's encoder.json and vocab.bpe (the
// Hub's vocab.json and merges.txt) are: the 256 byte tokens under GPT-2's byte -> code point
// map, then a few merged tokens ("he", "ll", " t", " the", "hell") and <|endoftext|>, 262 in
// all.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

namespace drover::engine {

// GPT-2's byte -> code point map, written out independently of the implementation.
inline std::string ByteSymbol(int b) {
  const bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  int cp = b;
  if (!direct) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

// The JSON string literal for a symbol: ASCII stays, the rest as \uXXXX (as OpenAI's
// encoder.json is written), quotes and backslashes escaped.
inline std::string JsonKey(int b) {
  const std::string sym = ByteSymbol(b);
  if (sym.size() == 1) {
    if (sym == "\"" || sym == "\\") return "\"\\" + sym + "\"";
    return "\"" + sym + "\"";
  }
  const int cp = ((sym[0] & 0x1F) << 6) | (sym[1] & 0x3F);
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\"\\u%04x\"", cp);
  return buf;
}

// The vocabulary: the byte tokens at id = byte + offset, then the merged ones at 256..261.
inline void WriteGpt2TestVocab(const std::string& encoder_path, const std::string& merges_path,
                               int offset = 0) {
  std::ofstream enc(encoder_path);
  enc << "{";
  for (int b = 0; b < 256; ++b) enc << JsonKey(b) << ": " << b + offset << ",\n";
  enc << "\"he\": 256, \"ll\": 257, \"\\u0120t\": 258, \"\\u0120the\": 259, \"hell\": 260, "
         "\"<|endoftext|>\": 261}";
  std::ofstream merges(merges_path);
  merges << "#version: 0.2\nh e\nl l\n\xC4\xA0 t\n\xC4\xA0t he\nhe ll\n";
}

}  // namespace drover::engine
