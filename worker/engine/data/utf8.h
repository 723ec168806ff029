// Minimal UTF-8 helpers for the tokenizers (no locale, no ICU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace drover::engine::utf8 {

// Decodes the code point at text[pos]; sets *len to its byte length. Malformed input
// (bad lead or continuation byte, overlong, surrogate, past U+10FFFF, truncated) decodes as
// one byte with code point U+FFFD, so every byte is consumed exactly once.
uint32_t DecodeAt(std::string_view text, size_t pos, size_t* len);

// Appends the UTF-8 encoding of cp (CHECKs cp <= U+10FFFF).
void Append(uint32_t cp, std::string* out);

}  // namespace drover::engine::utf8
