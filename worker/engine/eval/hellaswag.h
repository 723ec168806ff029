// HellaSwag (Zellers et al., 2019) and any benchmark of its shape: a context and several
// endings, one of them right. A model picks the ending whose tokens it finds least
// surprising after the context, as GPT-2 / GPT-3 were scored on it and as llm.c scores it
// during training: the sum of the ending tokens' cross-entropy ("acc") and its mean per
// token ("acc_norm", the number usually quoted: it does not favour short endings).
//
// The file is the benchmark's JSON lines (hellaswag_val.jsonl): one object per line with
// "ctx" (a string), "endings" (an array of strings) and "label" (the right ending's index);
// other keys (ind, activity_label, source_id, split...) are ignored. Each ending is
// tokenized with a space before it, as GPT-2 saw words after a context.
//
// Thread-safety: the functions are not re-entrant on one GptInference (they run its passes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/engine/data/tokenizer.h"
#include "worker/engine/model/gpt_inference.h"

namespace drover::engine {

struct ChoiceExample {
  int line = 0;  // 1-based, in the file it was read from
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> endings;
  int label = 0;
};

// Reads at most `limit` examples (0: all) of a HellaSwag-style JSON lines file, tokenized
// with `tokenizer`. Blank lines are skipped. NotFound for a missing file; InvalidArgument
// naming the line and key for bad JSON, a missing or mistyped key, fewer than two endings,
// an empty context or ending, or a label out of range.
StatusOr<std::vector<ChoiceExample>> ReadChoiceExamples(const std::string& path,
                                                        const Tokenizer& tokenizer, int limit = 0);

// A file of tokenized examples, written by `drover data hellaswag` and read by a job's
// trainer (data.hellaswag), which has no tokenizer: little-endian int32 throughout, the magic
// kChoiceFileMagic, version 1 and the example count, then each example's line, label, ending
// count, context length, the context's tokens, and each ending's length and tokens.
// WriteChoiceFile replaces `path` atomically. ReadChoiceFile reads the first `limit` examples
// (0: all); NotFound for a missing file, DataLoss naming the file and the example for one
// that is not such a file or is cut short or malformed (a count or length out of range, a
// negative token, a label past the endings).
inline constexpr int32_t kChoiceFileMagic = 0x43525644;  // "DVRC"
Status WriteChoiceFile(const std::string& path, const std::vector<ChoiceExample>& examples);
StatusOr<std::vector<ChoiceExample>> ReadChoiceFile(const std::string& path, int limit = 0);

// One ending's row for a (rows, T) pass: the tail of the context that fits before the whole
// ending, then the ending; `ending_at` is where the ending starts in `tokens`. Position t of
// the row predicts its token t + 1, so the ending is scored at positions ending_at - 1 to
// tokens.size() - 2.
struct ChoiceRow {
  std::vector<int32_t> tokens;
  int ending_at = 0;
};
// The rows of an example's endings for passes of T positions and a vocabulary of V tokens.
// InvalidArgument naming the example's line when an ending alone does not fit T with a token
// of context before it ("...; `t_name` T holds at most T - 1 after a token of context"), or a
// token is outside [0, V) (a tokenizer that does not match the model).
StatusOr<std::vector<ChoiceRow>> ChoiceRows(const ChoiceExample& example, int T, int V,
                                            const std::string& t_name);
// The ending's summed loss, from its row's per-position losses (losses[t] = -log p(tokens[t +
// 1] | tokens[0..t]), at least tokens.size() - 1 of them), in double.
double EndingLoss(const ChoiceRow& row, const float* losses);

struct ChoiceScores {
  std::vector<double> sum_loss;   // per ending: sum over its tokens of -log p(token)
  std::vector<double> mean_loss;  // per ending: sum_loss / its token count
  int pick_sum = 0;               // argmin of sum_loss (the first of equals)
  int pick_mean = 0;              // argmin of mean_loss
};

// Scores one example: passes of (up to 8 endings, T) rows, each its context then its ending,
// left-truncated to the model's block size (the ending is always whole), right-padded; each
// token's loss is the model's own per-position cross-entropy (GptInference::Loss, fp32
// whatever the run's precision), summed in double; so on whichever device and precision
// `model` runs. InvalidArgument (naming the line) when an ending alone does not fit the
// block size with one context token before it, or a token is outside the model's vocabulary
// (a tokenizer that does not match the model).
StatusOr<ChoiceScores> ScoreChoices(GptInference& model, const ChoiceExample& example);

struct ChoiceAccuracy {
  int examples = 0;
  int correct_sum = 0;   // pick_sum == label
  int correct_mean = 0;  // pick_mean == label
  double acc() const { return examples > 0 ? double(correct_sum) / examples : 0; }
  double acc_norm() const { return examples > 0 ? double(correct_mean) / examples : 0; }
};

// The scores of an example from each ending's summed loss (EndingLoss).
ChoiceScores ScoresFromLosses(const ChoiceExample& example, const std::vector<double>& sum_loss);

// Scores every example; the first error stops it.
StatusOr<ChoiceAccuracy> EvaluateChoices(GptInference& model,
                                         const std::vector<ChoiceExample>& examples);

}  // namespace drover::engine
