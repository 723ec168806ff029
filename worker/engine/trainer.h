// The single-process training loop (issue 3), used by `drover train` and by the
// drover-trainer executable that the worker agent launches.
//
// A Trainer owns the model (from the job spec, train.init_from, or the newest valid
// checkpoint in checkpoint.dir), AdamW, the train DataLoader and the validation loader. One
// optimizer step is accum = global_batch / (dp * micro_batch) micro-batches of
// Forward + Backward(1/accum), global-norm clipping, then AdamW with the scheduled LR.
// Here dp = 1: a world size above 1 is refused (data parallelism is a later issue).
//
// Side effects, all under the job's output_dir / checkpoint.dir: one JSON line per step in
// <output_dir>/metrics.jsonl, checkpoints every checkpoint.every_steps (asynchronous when
// checkpoint.async), the final model as the llm.c model file <output_dir>/model.bin.
// Progress and complete checkpoints go to the TrainerListener when one is given.
//
// Thread-safety: a Trainer is driven by one thread. `stop` may be set from any thread (or
// a signal handler); the loop checks it between micro-batches and abandons the step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"
#include "worker/engine/ckpt/async_writer.h"
#include "worker/engine/data/loader.h"
#include "worker/engine/metrics.h"
#include "worker/engine/model/gpt.h"
#include "worker/engine/optim/adamw.h"

namespace drover::engine {

// Where progress goes besides the log and metrics.jsonl: drover-trainer forwards these to
// the worker agent (worker/trainer_reporter.h). Called on the training thread, except
// OnCheckpoint, which runs on the checkpoint writer thread.
class TrainerListener {
 public:
  virtual ~TrainerListener() = default;
  virtual void OnStep(const StepMetrics& metrics) = 0;
  // A checkpoint directory became complete.
  virtual void OnCheckpoint(const v1::CheckpointRecord& record) = 0;
  // Training finished; the final model is written.
  virtual void OnDone() = 0;
};

struct TrainerOptions {
  JobSpec spec;
  std::string job_id;  // recorded in checkpoints and reports ("" outside a cluster)
  int64_t attempt = 0;
  int world_size = 1;     // > 1 is refused for now
  bool resume = true;     // continue from the newest valid checkpoint in checkpoint.dir
  int prefetch = 2;       // micro-batches the loader assembles ahead
  bool log_steps = true;  // one log line per train.log_every steps
  TrainerListener* listener = nullptr;      // not owned; nullptr = no reports
  const std::atomic<bool>* stop = nullptr;  // not owned; set = stop promptly
};

// The checkpoint directory the spec names: checkpoint.dir, else <output_dir>/ckpt.
std::string CheckpointDirOf(const JobSpec& spec);
// The output directory: output_dir, else runs/<name>.
std::string OutputDirOf(const JobSpec& spec);

class Trainer {
 public:
  // Validates the spec for this process, opens the data (checking every token id against
  // the vocabulary), builds or restores the model and optimizer. InvalidArgument for a bad
  // spec or data, FailedPrecondition for a world size above 1, NotFound for missing files.
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);
  ~Trainer();

  // Trains from step() to train.steps, evaluating, checkpointing and logging as the spec
  // says, then writes the final checkpoint (when checkpoints are enabled) and model.bin and
  // reports Done. Cancelled when `stop` was set (the step in progress is abandoned; the
  // checkpoint in flight, if any, is completed first).
  Status Run();

  // One optimizer step (no eval, checkpoint or model file). Cancelled when stopped.
  StatusOr<StepMetrics> Step();

  // Mean validation loss over the first min(eval_batches, available) batches of
  // (micro_batch, seq_len), or NotFound when there is no validation data.
  StatusOr<double> Evaluate();

  // Snapshots the state and writes checkpoint step_<step()> (in the background when
  // `async`; Flush waits for it).
  Status SaveCheckpoint(bool async);
  Status FlushCheckpoints();

  // Writes the model as an llm.c model file.
  Status SaveModel(const std::string& path) const;

  int64_t step() const { return step_; }                  // optimizer steps completed
  int64_t resumed_from() const { return resumed_from_; }  // checkpoint step, -1 if none
  Gpt& model() { return *model_; }
  const AdamW& optimizer() const { return *optimizer_; }
  const JobSpec& spec() const { return options_.spec; }
  int accum_steps() const { return accum_; }

 private:
  explicit Trainer(const TrainerOptions& options);
  Status Init();
  Status InitModel();
  Status OpenData();
  Status RestoreLatest();
  bool StopRequested() const;
  void LogStep(const StepMetrics& m) const;
  void OnCheckpointComplete(const v1::CheckpointManifest& meta, const std::string& path);

  TrainerOptions options_;
  std::string output_dir_;
  std::string ckpt_dir_;
  int B_ = 0;
  int T_ = 0;
  int accum_ = 1;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::shared_ptr<const TokenDataset> train_data_;
  std::shared_ptr<const TokenDataset> val_data_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<EvalLoader> val_loader_;
  std::unique_ptr<ckpt::AsyncCheckpointWriter> writer_;
  MetricsWriter metrics_;
  std::vector<int32_t> inputs_;   // (B, T)
  std::vector<int32_t> targets_;  // (B, T)
  int64_t step_ = 0;
  int64_t resumed_from_ = -1;
  int64_t last_checkpoint_step_ = -1;
};

}  // namespace drover::engine
