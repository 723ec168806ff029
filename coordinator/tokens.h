// Bearer tokens the coordinator accepts on JobService calls, from its --tokens file.
//
// File format: one token a line, three fields separated by blanks,
//     TOKEN  ROLE  NAME
// ROLE is `admin` (every JobService call) or `read-only` (status, jobs, logs, workers,
// wait; not submit, cancel or rm); NAME says whose token it is, in the coordinator's log.
// Blank lines and lines starting with `#` are ignored. A token is at least
// kMinTokenLength printable ASCII characters without blanks (`openssl rand -hex 32` makes
// one); a token listed twice is an error, so a pasted duplicate cannot hide a role.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace drover::coordinator {

enum class Role { kAdmin, kReadOnly };

inline constexpr size_t kMinTokenLength = 16;

struct TokenEntry {
  std::string token;
  Role role = Role::kReadOnly;
  std::string name;
};

// Parses the text of a token file; `path` names it in errors ("tokens.txt:3: ...").
// InvalidArgument on a malformed line, a duplicate token, or no token at all.
StatusOr<std::vector<TokenEntry>> ParseTokenFile(std::string_view text, std::string_view path);

// Reads and parses `path`.
StatusOr<std::vector<TokenEntry>> LoadTokenFile(const std::string& path);

// The entry whose token equals `token`, or nullptr. Every entry is compared, each in time
// that depends on the lengths alone, so response times do not tell a guesser how many
// leading characters were right.
const TokenEntry* FindToken(const std::vector<TokenEntry>& entries, std::string_view token);

// a == b in time that depends only on the lengths of a and b.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

std::string_view RoleName(Role role);

}  // namespace drover::coordinator
