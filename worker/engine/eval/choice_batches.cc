#include "worker/engine/eval/choice_batches.h"

#include <algorithm>
#include <utility>

namespace drover::engine {

StatusOr<std::unique_ptr<ChoiceBatches>> ChoiceBatches::Create(std::vector<ChoiceExample> examples,
                                                               int B, int T, int V) {
  DROVER_CHECK(B >= 1 && T >= 1 && !examples.empty());
  std::vector<ChoiceRow> rows;
  size_t longest = 1;
  for (const ChoiceExample& ex : examples) {
    ASSIGN_OR_RETURN(std::vector<ChoiceRow> mine, ChoiceRows(ex, T, V, "train.seq_len"));
    for (ChoiceRow& row : mine) {
      longest = std::max(longest, row.tokens.size());
      rows.push_back(std::move(row));
    }
  }
  // A row of T may hold a cut context; one shorter than T never does, so it is what a row of
  // any length from its own up to T holds.
  int k = 1;
  for (int d = T; d >= 1; --d) {
    if (T % d == 0 && static_cast<size_t>(T / d) >= longest) {
      k = d;
      break;
    }
  }
  return std::unique_ptr<ChoiceBatches>(
      new ChoiceBatches(std::move(examples), std::move(rows), B * k, T / k));
}

ChoiceBatches::ChoiceBatches(std::vector<ChoiceExample> examples, std::vector<ChoiceRow> rows,
                             int B, int T)
    : examples_(std::move(examples)), rows_(std::move(rows)), B_(B), T_(T), sums_(rows_.size()) {}

void ChoiceBatches::Batch(int64_t i, int32_t* inputs, int32_t* targets) const {
  DROVER_CHECK(i >= 0 && i < num_batches());
  const size_t BT = static_cast<size_t>(B_) * T_;
  std::fill(inputs, inputs + BT, 0);
  std::fill(targets, targets + BT, 0);
  for (int b = 0; b < B_; ++b) {
    const int64_t r = i * B_ + b;
    if (r >= static_cast<int64_t>(rows_.size())) break;
    const std::vector<int32_t>& row = rows_[r].tokens;
    std::copy(row.begin(), row.end(), inputs + static_cast<size_t>(b) * T_);
    std::copy(row.begin() + 1, row.end(), targets + static_cast<size_t>(b) * T_);
  }
}

void ChoiceBatches::Reset() { std::fill(sums_.begin(), sums_.end(), 0.0); }

void ChoiceBatches::AddLosses(int64_t i, const float* losses) {
  DROVER_CHECK(i >= 0 && i < num_batches());
  for (int b = 0; b < B_; ++b) {
    const int64_t r = i * B_ + b;
    if (r >= static_cast<int64_t>(rows_.size())) break;
    sums_[r] += EndingLoss(rows_[r], losses + static_cast<size_t>(b) * T_);
  }
}

ChoiceAccuracy ChoiceBatches::Accuracy() const {
  ChoiceAccuracy acc;
  size_t row = 0;
  for (const ChoiceExample& ex : examples_) {
    const std::vector<double> sums(sums_.begin() + static_cast<ptrdiff_t>(row),
                                   sums_.begin() + static_cast<ptrdiff_t>(row + ex.endings.size()));
    row += ex.endings.size();
    const ChoiceScores s = ScoresFromLosses(ex, sums);
    ++acc.examples;
    acc.correct_sum += s.pick_sum == ex.label ? 1 : 0;
    acc.correct_mean += s.pick_mean == ex.label ? 1 : 0;
  }
  return acc;
}

}  // namespace drover::engine
