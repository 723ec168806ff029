#include "coordinator/tokens.h"

#include <sstream>

#include "common/files.h"

namespace drover::coordinator {
namespace {

bool IsTokenChar(char c) { return c > ' ' && c < 0x7f; }

std::vector<std::string> SplitBlanks(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(f);
  return fields;
}

}  // namespace

std::string_view RoleName(Role role) { return role == Role::kAdmin ? "admin" : "read-only"; }

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // No early exit: every byte of `a` is looked at whatever the first difference.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

const TokenEntry* FindToken(const std::vector<TokenEntry>& entries, std::string_view token) {
  const TokenEntry* found = nullptr;
  for (const TokenEntry& e : entries) {
    if (ConstantTimeEquals(e.token, token)) found = &e;
  }
  return found;
}

StatusOr<std::vector<TokenEntry>> ParseTokenFile(std::string_view text, std::string_view path) {
  std::vector<TokenEntry> entries;
  std::istringstream in{std::string(text)};
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::string where = std::string(path) + ":" + std::to_string(line_no) + ": ";
    std::vector<std::string> fields = SplitBlanks(line);
    if (fields.empty() || fields[0].starts_with("#")) continue;
    if (fields.size() != 3) {
      return InvalidArgumentError(where + "expected 'TOKEN ROLE NAME' (3 fields), got " +
                                  std::to_string(fields.size()));
    }
    TokenEntry e;
    e.token = fields[0];
    e.name = fields[2];
    // The token itself is never echoed: the message may end up in a shared log.
    if (e.token.size() < kMinTokenLength) {
      return InvalidArgumentError(where + "the token of '" + e.name + "' has " +
                                  std::to_string(e.token.size()) + " characters; use at least " +
                                  std::to_string(kMinTokenLength) + " (openssl rand -hex 32)");
    }
    for (char c : e.token) {
      if (!IsTokenChar(c)) {
        return InvalidArgumentError(where + "the token of '" + e.name +
                                    "' has a character that is not printable ASCII");
      }
    }
    if (fields[1] == "admin") {
      e.role = Role::kAdmin;
    } else if (fields[1] == "read-only") {
      e.role = Role::kReadOnly;
    } else {
      return InvalidArgumentError(where + "role '" + fields[1] +
                                  "' is not valid; use admin or read-only");
    }
    if (FindToken(entries, e.token) != nullptr) {
      return InvalidArgumentError(where + "the token of '" + e.name + "' is listed before (as '" +
                                  FindToken(entries, e.token)->name +
                                  "'); each token may appear once");
    }
    entries.push_back(std::move(e));
  }
  if (entries.empty()) {
    return InvalidArgumentError(std::string(path) +
                                ": holds no token (lines 'TOKEN ROLE NAME', ROLE admin or "
                                "read-only)");
  }
  return entries;
}

StatusOr<std::vector<TokenEntry>> LoadTokenFile(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok())
    return InvalidArgumentError("--tokens '" + path + "': " + text.status().message());
  return ParseTokenFile(*text, path);
}

}  // namespace drover::coordinator
