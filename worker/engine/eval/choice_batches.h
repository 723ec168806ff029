// ChoiceBatches: a benchmark of ChoiceExamples (eval/hellaswag.h) scored by a training job at
// its evaluation steps (data.hellaswag), through the same passes as its validation loss
// (ParallelGpt::Evaluate), on whatever mesh it runs: every ending a row, the rows in example
// order, padded at the end; each rank's part of the rows' losses summed over the ranks, then
// the picks made as `drover eval --hellaswag` makes them (ScoresFromLosses).
//
// Rows are as short as the examples allow: the job's micro-batch of B rows of T positions
// holds B * k rows of T / k, for the largest k that divides T and leaves room for the longest
// row (context and ending, uncut). HellaSwag's rows are under 200 GPT-2 tokens, so at T = 1024
// a batch holds 4x the rows and an evaluation runs a quarter of the passes (llm.c runs rows of
// T). A row's losses do not depend on its length: the attention is causal within it and its
// positions start at 0. Where some row's context must be cut to fit T, rows are T long.
//
// Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "worker/engine/eval/hellaswag.h"

namespace drover::engine {

class ChoiceBatches {
 public:
  // Batches of B * T positions (a job's micro-batch), token ids below V. InvalidArgument
  // (from ChoiceRows, naming train.seq_len) when an ending does not fit T, or a token is not
  // below V.
  static StatusOr<std::unique_ptr<ChoiceBatches>> Create(std::vector<ChoiceExample> examples, int B,
                                                         int T, int V);

  // A batch is rows_per_batch() rows of row_length() positions: B * k and T / k.
  int rows_per_batch() const { return B_; }
  int row_length() const { return T_; }
  int64_t num_batches() const { return (static_cast<int64_t>(rows_.size()) + B_ - 1) / B_; }
  int64_t num_examples() const { return static_cast<int64_t>(examples_.size()); }

  // Fills (rows_per_batch(), row_length()) inputs and targets with batch i (padding past the
  // last row and each row's end: token 0, its losses never read). i in [0, num_batches())
  // (CHECKed).
  void Batch(int64_t i, int32_t* inputs, int32_t* targets) const;

  // Forgets the losses added so far: the next evaluation starts.
  void Reset();
  // Adds batch i's per-position losses, (rows_per_batch(), row_length()), to its rows' sums.
  void AddLosses(int64_t i, const float* losses);
  // Each row's summed ending loss so far, to sum over the ranks in place.
  std::vector<double>& sums() { return sums_; }
  const std::vector<double>& sums() const { return sums_; }
  // The accuracy from sums(), once every rank's part is in them.
  ChoiceAccuracy Accuracy() const;

 private:
  ChoiceBatches(std::vector<ChoiceExample> examples, std::vector<ChoiceRow> rows, int B, int T);

  std::vector<ChoiceExample> examples_;
  std::vector<ChoiceRow> rows_;  // every example's endings, in order
  int B_, T_;                    // rows a batch, and their length
  std::vector<double> sums_;     // per row
};

}  // namespace drover::engine
