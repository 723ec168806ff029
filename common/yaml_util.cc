#include "common/yaml_util.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace drover::yaml_util {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// yaml-cpp's tag for a plain node is "?", for a quoted scalar "!", and for an explicit
// standard tag (!!int) its long form.
bool IsKnownTag(const std::string& tag) {
  static constexpr std::string_view kStandard = "tag:yaml.org,2002:";
  if (tag.empty() || tag == "?" || tag == "!") return true;
  if (tag.rfind(kStandard, 0) != 0) return false;
  const std::string_view name = std::string_view(tag).substr(kStandard.size());
  return name == "str" || name == "int" || name == "float" || name == "bool" || name == "null" ||
         name == "seq" || name == "map";
}

// "+12", "-3", "007": an integer written in decimal, whatever its size.
bool IsDecimalIntegerText(std::string_view text) {
  if (!text.empty() && (text.front() == '+' || text.front() == '-')) text.remove_prefix(1);
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "'123...' is out of range: allowed -9223372036854775808 to 9223372036854775807".
template <typename T>
Status OutOfRange(const YAML::Node& node) {
  return InvalidArgumentError(Describe(node) + " is out of range for this field: allowed " +
                              std::to_string(std::numeric_limits<T>::min()) + " to " +
                              std::to_string(std::numeric_limits<T>::max()));
}

// Scalars only; anything else gets one uniform message naming what was expected.
Status RequireScalar(const YAML::Node& node, std::string_view expected) {
  if (node.IsScalar()) return OkStatus();
  return InvalidArgumentError("expected " + std::string(expected) + ", got " + Describe(node));
}

// The documents of a YAML stream, as parser events: where each one's first value is, and
// whether the last one held anything but a null.
class DocumentCounter final : public YAML::EventHandler {
 public:
  int count() const { return static_cast<int>(first_values_.size()); }
  bool last_was_empty() const { return empty_; }
  // 1-based line of document i's first value, 0 when it has none.
  int FirstValueLine(int i) const { return first_values_[i]; }

  void OnDocumentStart(const YAML::Mark&) override {
    first_values_.push_back(0);
    empty_ = true;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Value(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Value(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Value(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Value(mark);
  }
  void OnMapEnd() override {}

 private:
  void Value(const YAML::Mark& mark) {
    if (empty_) first_values_.back() = mark.line + 1;  // yaml-cpp counts lines from 0
    empty_ = false;
  }
  std::vector<int> first_values_;
  bool empty_ = true;
};

}  // namespace

Status Parse(const std::string& text, YAML::Node* out) {
  DocumentCounter docs;
  try {
    // Not YAML::LoadAll: yaml-cpp 0.7 (Debian 12's) never returns from it on some malformed
    // input. At a token no rule consumes (a lone ',' is enough) it 'finds' an empty document
    // and comes back to the same token, forever, allocating a node each time until the
    // process runs out of memory (yaml-cpp issue 1040; fixed in 0.8 by ending the stream at
    // an empty document, pull request 1319). The documents are counted here with the same
    // rule, then the first one is loaded alone (YAML::Load reads one document).
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(docs) && !docs.last_was_empty()) {
    }
    *out = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    // yaml-cpp marks are 0-based; people count from 1.
    return InvalidArgumentError("invalid YAML at line " + std::to_string(e.mark.line + 1) +
                                ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  // A second document would be dropped without a word by a reader that takes the first:
  // whatever it was meant to set would silently not be set.
  if (docs.count() > 1) {
    const int line = docs.FirstValueLine(1);
    return InvalidArgumentError("the text holds " + std::to_string(docs.count()) +
                                " YAML documents (a second one starts" +
                                (line > 0 ? " at line " + std::to_string(line) : "") +
                                " after '---'); put everything in one document");
  }
  return CheckTags(*out);
}

Status CheckTags(const YAML::Node& root) {
  // Aliases make a tree a graph: a few lines can name billions of nodes ("billion laughs").
  // The walk gives up well before that, and so should a reader of such a document.
  constexpr int64_t kMaxNodes = 1'000'000;
  int64_t visited = 0;
  std::vector<YAML::Node> stack = {root};
  while (!stack.empty()) {
    const YAML::Node node = stack.back();
    stack.pop_back();
    if (++visited > kMaxNodes) {
      return InvalidArgumentError("the YAML expands to more than " + std::to_string(kMaxNodes) +
                                  " values (through aliases?)");
    }
    if (!node.IsDefined() || node.IsNull()) continue;
    if (!IsKnownTag(node.Tag())) {
      const int line = LineOf(node);
      return InvalidArgumentError(
          "unknown YAML tag '" + node.Tag() + "'" +
          (line > 0 ? " at line " + std::to_string(line) : "") +
          "; only the standard !!str, !!int, !!float, !!bool, !!null, !!seq and !!map are "
          "allowed");
    }
    if (node.IsSequence()) {
      for (const YAML::Node& child : node) stack.push_back(child);
    } else if (node.IsMap()) {
      for (const auto& kv : node) {
        stack.push_back(kv.first);
        stack.push_back(kv.second);
      }
    }
  }
  return OkStatus();
}

int LineOf(const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? 0 : mark.line + 1;
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

bool ParseInt64(std::string_view text, int64_t* out) {
  if (!text.empty() && text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && text.front() == '-') return false;
  }
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

bool ParseDouble(std::string_view text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return false;
  std::string copy(text);  // strtod needs a terminated string
  char* end = nullptr;
  const double v = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

Status DecodeScalar(const YAML::Node& node, int64_t* out) {
  RETURN_IF_ERROR(RequireScalar(node, "an integer"));
  if (!ParseInt64(node.Scalar(), out)) {
    if (IsDecimalIntegerText(node.Scalar())) return OutOfRange<int64_t>(node);
    return InvalidArgumentError("expected an integer, got " + Describe(node));
  }
  return OkStatus();
}

Status DecodeScalar(const YAML::Node& node, int* out) {
  int64_t v = 0;
  const Status st = DecodeScalar(node, &v);
  // Past int64 or only past int32: either way the range to name is int32's.
  const bool past_int64 = !st.ok() && node.IsScalar() && IsDecimalIntegerText(node.Scalar());
  if (past_int64 ||
      (st.ok() && (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()))) {
    return OutOfRange<int>(node);
  }
  RETURN_IF_ERROR(st);
  *out = static_cast<int>(v);
  return OkStatus();
}

Status DecodeScalar(const YAML::Node& node, uint64_t* out) {
  RETURN_IF_ERROR(RequireScalar(node, "a non-negative integer"));
  std::string_view text = node.Scalar();
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  if (ec == std::errc::result_out_of_range && ptr == end) return OutOfRange<uint64_t>(node);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return InvalidArgumentError("expected a non-negative integer, got " + Describe(node));
  }
  return OkStatus();
}

Status DecodeScalar(const YAML::Node& node, double* out) {
  RETURN_IF_ERROR(RequireScalar(node, "a number"));
  if (!ParseDouble(node.Scalar(), out)) {
    return InvalidArgumentError("expected a finite number, got " + Describe(node));
  }
  return OkStatus();
}

Status DecodeScalar(const YAML::Node& node, bool* out) {
  RETURN_IF_ERROR(RequireScalar(node, "true or false"));
  const std::string v = Lower(node.Scalar());
  if (v == "true" || v == "yes" || v == "on") {
    *out = true;
  } else if (v == "false" || v == "no" || v == "off") {
    *out = false;
  } else {
    return InvalidArgumentError("expected true or false, got " + Describe(node));
  }
  return OkStatus();
}

Status DecodeScalar(const YAML::Node& node, std::string* out) {
  if (node.IsNull()) {
    out->clear();
    return OkStatus();
  }
  RETURN_IF_ERROR(RequireScalar(node, "a string"));
  *out = node.Scalar();
  return OkStatus();
}

std::string FormatDouble(double value) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  DROVER_CHECK(ec == std::errc());
  std::string s(buf, ptr);
  if (!std::isfinite(value)) return s;
  const size_t e = s.find('e');
  if (s.find('.') == std::string::npos) s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];  // row[i-1][j-1]
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  // A third of the word's length (at least 2) catches transpositions and dropped letters;
  // words of three letters or fewer get one edit, or every short key would match.
  if (word.empty()) return "";
  const size_t limit = word.size() <= 3 ? 1 : std::max<size_t>(2, word.size() / 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(Lower(word), Lower(c));
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace drover::yaml_util
