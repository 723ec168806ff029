#include "worker/engine/eval/hellaswag.h"

#include <algorithm>
#include <cmath>
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

StatusOr<ChoiceScores> ScoreChoices(GptInference& model, const ChoiceExample& example) {
  const GptConfig& cfg = model.config();
  const int maxT = cfg.max_seq_len;
  const int n = static_cast<int>(example.endings.size());
  // Each row: the tail of the context that fits before the whole ending.
  std::vector<std::vector<int32_t>> rows(n);
  std::vector<int> ending_at(n);
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t>& end = example.endings[i];
    if (static_cast<int>(end.size()) + 1 > maxT) {
      return InvalidArgumentError(
          "line " + std::to_string(example.line) + ": ending " + std::to_string(i) + " is " +
          std::to_string(end.size()) + " tokens; the model's block size " + std::to_string(maxT) +
          " holds at most " + std::to_string(maxT - 1) + " after a token of context");
    }
    const size_t keep = std::min(example.context.size(), static_cast<size_t>(maxT) - end.size());
    rows[i].assign(example.context.end() - static_cast<ptrdiff_t>(keep), example.context.end());
    ending_at[i] = static_cast<int>(rows[i].size());
    rows[i].insert(rows[i].end(), end.begin(), end.end());
    for (const int32_t t : rows[i]) {
      if (t < 0 || t >= cfg.vocab_size) {
        return InvalidArgumentError("line " + std::to_string(example.line) + ": token " +
                                    std::to_string(t) + " is outside the model's vocabulary of " +
                                    std::to_string(cfg.vocab_size) +
                                    " (a tokenizer that does not match the model?)");
      }
    }
  }
  // At most kRows rows a Forward: a file with thousands of endings to an example must not
  // ask for thousands of (T, V) logit rows at once.
  constexpr int kRows = 8;
  std::vector<float> losses(static_cast<size_t>(std::min(kRows, n)) * maxT);
  ChoiceScores s;
  for (int first = 0; first < n; first += kRows) {
    const int rows_now = std::min(kRows, n - first);
    int T = 1;
    for (int i = first; i < first + rows_now; ++i)
      T = std::max(T, static_cast<int>(rows[i].size()));
    // Position t of a row predicts its token t + 1; past the row's end, the padding and
    // its targets are any token (0), and their losses are not read.
    std::vector<int32_t> inputs(static_cast<size_t>(rows_now) * T, 0);
    std::vector<int32_t> targets(inputs.size(), 0);
    for (int i = 0; i < rows_now; ++i) {
      const std::vector<int32_t>& row = rows[first + i];
      std::copy(row.begin(), row.end(), &inputs[size_t(i) * T]);
      std::copy(row.begin() + 1, row.end(), &targets[size_t(i) * T]);
    }
    model.Loss(inputs.data(), targets.data(), rows_now, T, losses.data());
    for (int i = 0; i < rows_now; ++i) {
      const std::vector<int32_t>& row = rows[first + i];
      double sum = 0;
      // The ending's tokens are predicted from position ending_at - 1 on.
      for (int t = ending_at[first + i] - 1; t + 1 < static_cast<int>(row.size()); ++t) {
        sum += losses[static_cast<size_t>(i) * T + t];
      }
      s.sum_loss.push_back(sum);
      s.mean_loss.push_back(sum / static_cast<double>(example.endings[first + i].size()));
    }
  }
  s.pick_sum =
      static_cast<int>(std::min_element(s.sum_loss.begin(), s.sum_loss.end()) - s.sum_loss.begin());
  s.pick_mean = static_cast<int>(std::min_element(s.mean_loss.begin(), s.mean_loss.end()) -
                                 s.mean_loss.begin());
  return s;
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
