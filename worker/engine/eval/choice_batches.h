// ChoiceBatches: a benchmark of ChoiceExamples (eval/hellaswag.h) scored by a training job at
// its evaluation steps (data.hellaswag), through the same passes as its validation loss
// (ParallelGpt::Evaluate), on whatever mesh it runs: every ending a row of (B, T) batches of
// the job's micro_batch and seq_len, the rows in example order, padded at the end; each
// rank's part of the rows' losses summed over the ranks, then the picks made as `drover eval
// --hellaswag` makes them (ScoresFromLosses). A row is the job's T long whatever its length,
// as llm.c scores HellaSwag in training: simple, and wasteful for short examples.
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
  // B rows of T positions a batch, token ids below V. InvalidArgument (from ChoiceRows,
  // naming train.seq_len) when an ending does not fit T, or a token is not below V.
  static StatusOr<std::unique_ptr<ChoiceBatches>> Create(std::vector<ChoiceExample> examples, int B,
                                                         int T, int V);

  int64_t num_batches() const { return (static_cast<int64_t>(rows_.size()) + B_ - 1) / B_; }
  int64_t num_examples() const { return static_cast<int64_t>(examples_.size()); }

  // Fills (B, T) inputs and targets with batch i: rows iB.. (padding past the last row and
  // each row's end: token 0, its losses never read). i in [0, num_batches()) (CHECKed).
  void Batch(int64_t i, int32_t* inputs, int32_t* targets) const;

  // Forgets the losses added so far: the next evaluation starts.
  void Reset();
  // Adds batch i's per-position losses, (B, T), to its rows' sums.
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
  int B_, T_;
  std::vector<double> sums_;  // per row
};

}  // namespace drover::engine
