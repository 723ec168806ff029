#include "worker/engine/eval/hellaswag.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/files.h"

namespace drover::engine {
namespace {

Status BadLine(const std::string& path, int line, const std::string& what) {
  return InvalidArgumentError(path + ":" + std::to_string(line) + ": " + what);
}

// One line's example, or why it is not one.
StatusOr<ChoiceExample> ParseExample(const std::string& path, int line, std::string_view text,
                                     const Tokenizer& tokenizer) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return BadLine(path, line, "not a JSON object");
  if (!j.is_object()) return BadLine(path, line, "not a JSON object");
  auto ctx = j.find("ctx");
  if (ctx == j.end() || !ctx->is_string() || ctx->get_ref<const std::string&>().empty()) {
    return BadLine(path, line, "\"ctx\" must be a non-empty string");
  }
  auto endings = j.find("endings");
  if (endings == j.end() || !endings->is_array() || endings->size() < 2) {
    return BadLine(path, line, "\"endings\" must be an array of at least two strings");
  }
  auto label = j.find("label");
  // The published files write the label as a number; some conversions write "2".
  int64_t value = -1;
  if (label != j.end() && label->is_number_integer()) {
    value = label->get<int64_t>();
  } else if (label != j.end() && label->is_string()) {
    const std::string& s = label->get_ref<const std::string&>();
    if (!s.empty() && s.size() < 10 &&
        std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      value = std::stoll(s);
    }
  }
  if (value < 0 || value >= static_cast<int64_t>(endings->size())) {
    return BadLine(
        path, line,
        "\"label\" must be the right ending's index, 0 to " + std::to_string(endings->size() - 1));
  }
  ChoiceExample ex;
  ex.line = line;
  ex.label = static_cast<int>(value);
  ex.context = tokenizer.Encode(ctx->get_ref<const std::string&>());
  for (size_t i = 0; i < endings->size(); ++i) {
    const nlohmann::json& e = (*endings)[i];
    if (!e.is_string() || e.get_ref<const std::string&>().empty()) {
      return BadLine(path, line, "ending " + std::to_string(i) + " must be a non-empty string");
    }
    ex.endings.push_back(tokenizer.Encode(" " + e.get_ref<const std::string&>()));
  }
  return ex;
}

}  // namespace

StatusOr<std::vector<ChoiceExample>> ReadChoiceExamples(const std::string& path,
                                                        const Tokenizer& tokenizer, int limit) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<ChoiceExample> examples;
  int line = 0;
  for (size_t at = 0;
       at < text.size() && (limit <= 0 || static_cast<int>(examples.size()) < limit);) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view row(text.data() + at, end - at);
    at = end + 1;
    ++line;
    if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    ASSIGN_OR_RETURN(ChoiceExample ex, ParseExample(path, line, row, tokenizer));
    examples.push_back(std::move(ex));
  }
  if (examples.empty()) return InvalidArgumentError(path + ": no examples in the file");
  return examples;
}

Status WriteChoiceFile(const std::string& path, const std::vector<ChoiceExample>& examples) {
  std::vector<int32_t> words = {kChoiceFileMagic, 1, static_cast<int32_t>(examples.size())};
  for (const ChoiceExample& ex : examples) {
    words.insert(words.end(), {ex.line, ex.label, static_cast<int32_t>(ex.endings.size()),
                               static_cast<int32_t>(ex.context.size())});
    words.insert(words.end(), ex.context.begin(), ex.context.end());
    for (const std::vector<int32_t>& end : ex.endings) {
      words.push_back(static_cast<int32_t>(end.size()));
      words.insert(words.end(), end.begin(), end.end());
    }
  }
  return WriteFileAtomic(
      path, std::string_view(reinterpret_cast<const char*>(words.data()), words.size() * 4));
}

StatusOr<std::vector<ChoiceExample>> ReadChoiceFile(const std::string& path, int limit) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  const size_t n = bytes.size() / 4;
  std::vector<int32_t> words(n);
  if (n > 0) std::memcpy(words.data(), bytes.data(), n * 4);
  size_t at = 0;
  const auto bad = [&](const std::string& what) {
    return DataLossError(path + ": " + what + " (not a file of `drover data hellaswag`?)");
  };
  if (bytes.size() % 4 != 0 || n < 3 || words[0] != kChoiceFileMagic) {
    return bad("not a file of tokenized examples");
  }
  if (words[1] != 1) return bad("version " + std::to_string(words[1]) + ", this reads 1");
  const int32_t count = words[2];
  if (count <= 0) return bad("an example count of " + std::to_string(count));
  at = 3;
  // The next `len` words as tokens, or why they are not.
  const auto take = [&](int32_t len, std::vector<int32_t>* out) -> Status {
    if (len <= 0 || static_cast<size_t>(len) > n - at)
      return bad("a length of " + std::to_string(len));
    out->assign(words.begin() + static_cast<ptrdiff_t>(at),
                words.begin() + static_cast<ptrdiff_t>(at + len));
    at += len;
    for (int32_t t : *out) {
      if (t < 0) return bad("a token of " + std::to_string(t));
    }
    return OkStatus();
  };
  std::vector<ChoiceExample> examples;
  const int32_t wanted = limit > 0 ? std::min(limit, count) : count;
  for (int32_t e = 0; e < wanted; ++e) {
    const std::string which = "example " + std::to_string(e + 1);
    if (n - at < 4) return bad(which + " is cut short");
    ChoiceExample ex;
    ex.line = words[at];
    ex.label = words[at + 1];
    const int32_t endings = words[at + 2], context = words[at + 3];
    at += 4;
    if (endings < 2 || endings > 1024) {
      return bad(which + " has " + std::to_string(endings) + " endings");
    }
    if (ex.label < 0 || ex.label >= endings) {
      return bad(which + " has label " + std::to_string(ex.label) + " of " +
                 std::to_string(endings) + " endings");
    }
    Status st = take(context, &ex.context);
    if (!st.ok()) return st.WithContext(which + "'s context");
    ex.endings.resize(endings);
    for (int32_t i = 0; i < endings; ++i) {
      if (at >= n) return bad(which + " is cut short");
      const int32_t len = words[at++];
      st = take(len, &ex.endings[i]);
      if (!st.ok()) return st.WithContext(which + "'s ending " + std::to_string(i));
    }
    examples.push_back(std::move(ex));
  }
  if (wanted == count && at != n) return bad("bytes after its last example");
  return examples;
}

StatusOr<std::vector<ChoiceRow>> ChoiceRows(const ChoiceExample& example, int T, int V,
                                            const std::string& t_name) {
  const int n = static_cast<int>(example.endings.size());
  std::vector<ChoiceRow> rows(n);
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t>& end = example.endings[i];
    if (static_cast<int>(end.size()) + 1 > T) {
      return InvalidArgumentError(
          "line " + std::to_string(example.line) + ": ending " + std::to_string(i) + " is " +
          std::to_string(end.size()) + " tokens; " + t_name + " " + std::to_string(T) +
          " holds at most " + std::to_string(T - 1) + " after a token of context");
    }
    // The tail of the context that fits before the whole ending.
    const size_t keep = std::min(example.context.size(), static_cast<size_t>(T) - end.size());
    ChoiceRow& row = rows[i];
    row.tokens.assign(example.context.end() - static_cast<ptrdiff_t>(keep), example.context.end());
    row.ending_at = static_cast<int>(row.tokens.size());
    row.tokens.insert(row.tokens.end(), end.begin(), end.end());
    for (const int32_t t : row.tokens) {
      if (t < 0 || t >= V) {
        return InvalidArgumentError("line " + std::to_string(example.line) + ": token " +
                                    std::to_string(t) + " is outside the model's vocabulary of " +
                                    std::to_string(V) +
                                    " (a tokenizer that does not match the model?)");
      }
    }
  }
  return rows;
}

double EndingLoss(const ChoiceRow& row, const float* losses) {
  double sum = 0;
  for (int t = row.ending_at - 1; t + 1 < static_cast<int>(row.tokens.size()); ++t)
    sum += losses[t];
  return sum;
}

ChoiceScores ScoresFromLosses(const ChoiceExample& example, const std::vector<double>& sum_loss) {
  ChoiceScores s;
  s.sum_loss = sum_loss;
  for (size_t i = 0; i < sum_loss.size(); ++i) {
    s.mean_loss.push_back(sum_loss[i] / static_cast<double>(example.endings[i].size()));
  }
  s.pick_sum =
      static_cast<int>(std::min_element(s.sum_loss.begin(), s.sum_loss.end()) - s.sum_loss.begin());
  s.pick_mean = static_cast<int>(std::min_element(s.mean_loss.begin(), s.mean_loss.end()) -
                                 s.mean_loss.begin());
  return s;
}

StatusOr<ChoiceScores> ScoreChoices(GptInference& model, const ChoiceExample& example) {
  const GptConfig& cfg = model.config();
  const int maxT = cfg.max_seq_len;
  const int n = static_cast<int>(example.endings.size());
  ASSIGN_OR_RETURN(std::vector<ChoiceRow> rows,
                   ChoiceRows(example, maxT, cfg.vocab_size, "the model's block size"));
  // At most kRows rows a Forward: a file with thousands of endings to an example must not
  // ask for thousands of (T, V) logit rows at once.
  constexpr int kRows = 8;
  std::vector<float> losses(static_cast<size_t>(std::min(kRows, n)) * maxT);
  std::vector<double> sum_loss;
  for (int first = 0; first < n; first += kRows) {
    const int rows_now = std::min(kRows, n - first);
    int T = 1;
    for (int i = first; i < first + rows_now; ++i) {
      T = std::max(T, static_cast<int>(rows[i].tokens.size()));
    }
    // Past the row's end, the padding and its targets are any token (0), and their losses
    // are not read.
    std::vector<int32_t> inputs(static_cast<size_t>(rows_now) * T, 0);
    std::vector<int32_t> targets(inputs.size(), 0);
    for (int i = 0; i < rows_now; ++i) {
      const std::vector<int32_t>& row = rows[first + i].tokens;
      std::copy(row.begin(), row.end(), &inputs[size_t(i) * T]);
      std::copy(row.begin() + 1, row.end(), &targets[size_t(i) * T]);
    }
    model.Loss(inputs.data(), targets.data(), rows_now, T, losses.data());
    for (int i = 0; i < rows_now; ++i) {
      sum_loss.push_back(EndingLoss(rows[first + i], &losses[static_cast<size_t>(i) * T]));
    }
  }
  return ScoresFromLosses(example, sum_loss);
}

StatusOr<ChoiceAccuracy> EvaluateChoices(GptInference& model,
                                         const std::vector<ChoiceExample>& examples) {
  ChoiceAccuracy acc;
  for (const ChoiceExample& ex : examples) {
    ASSIGN_OR_RETURN(ChoiceScores s, ScoreChoices(model, ex));
    ++acc.examples;
    acc.correct_sum += s.pick_sum == ex.label ? 1 : 0;
    acc.correct_mean += s.pick_mean == ex.label ? 1 : 0;
  }
  return acc;
}

}  // namespace drover::engine
