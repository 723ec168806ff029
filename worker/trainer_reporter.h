// Trainer side of the agent protocol: writes one JSON TrainerReport per line to the
// status channel whose fd the agent put in DROVER_STATUS_FD (worker/trainer_env.h).
//
// Without DROVER_STATUS_FD (a trainer run by `drover train`, not by an agent) every call
// is a no-op, so the engine uses the same code either way. Thread-safe: a report is one
// write of one whole line under a mutex, so lines never interleave. A failed write (the
// agent is gone) is ignored: the trainer dies with its agent anyway (PR_SET_PDEATHSIG).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "proto/drover.pb.h"

namespace drover {

// What a step reports beyond its loss and speed (the dashboard's charts).
struct TrainerStepExtras {
  double lr = 0;
  std::optional<double> val_loss;   // set on evaluation steps
  std::optional<double> hellaswag;  // set on evaluation steps of a job with data.hellaswag
  double mfu = 0;                   // 0: unknown
  double busy_ms = 0;               // the step's own time (engine/metrics.h)
  int pp_stage = 0;                 // this rank's pipeline stage
};

class TrainerReporter {
 public:
  // Reads DROVER_STATUS_FD; a missing or malformed value gives a disabled reporter.
  static TrainerReporter FromEnv();

  // Writes to `fd` (not owned; -1 disables).
  explicit TrainerReporter(int fd) : fd_(fd) {}
  TrainerReporter(TrainerReporter&& other) noexcept : fd_(other.fd_) {}

  bool enabled() const { return fd_ >= 0; }

  using StepExtras = TrainerStepExtras;

  // Reports the last completed optimizer step. last_checkpoint_step is filled in from the
  // last Checkpoint() call (-1 before any); the newest validation loss is carried by every
  // report from the step that measured it on (with its step), so that a heartbeat that
  // misses the eval step still forwards it. busy_ms is reported as the median of the last
  // kBusyWindow steps' (one slow step, a checkpoint's or a page fault's, is no straggler),
  // once kBusyMinSteps steps after the attempt's first kBusyWarmupSteps are in, else 0;
  // pace_ms likewise, of the same steps' step_ms.
  void Progress(int64_t step, double step_ms, double loss, double tokens_per_s,
                const StepExtras& extras = {}, const std::string& message = "");
  // Reports a phase without a step change ("loading data", "rendezvous"), with the last
  // step's numbers (its loss, step_ms and tokens_per_s too: the coordinator takes rank 0's
  // latest report as the job's loss and speed).
  void Phase(const std::string& message);
  // Work between two steps that may outlast the hang timeout (an evaluation): a Phase that
  // also moves TrainerProgress.work, which the coordinator's hang check counts as progress.
  void Working(const std::string& message);
  // Reports a complete checkpoint directory (rank 0, after the rename); clears the error
  // of an earlier failed one.
  void Checkpoint(const v1::CheckpointRecord& record);
  // Reports that a checkpoint could not be written: carried by every progress report from
  // now on, until a checkpoint completes.
  void CheckpointFailed(const std::string& error);
  // A loss spike at `spike_step` was rolled back to step `to_step`; carried by every
  // progress report from now on.
  void RolledBack(int64_t spike_step, int64_t to_step, int64_t rollbacks);
  // The attempt's ranks cannot all reach each other and `ranks` are cut off (the trainer
  // fails next): carried by every report from now on.
  void CutOff(const std::vector<int>& ranks);
  // Training finished; the process exits 0 next.
  void Done();

  static constexpr size_t kBusyWindow = 16;
  static constexpr size_t kBusyMinSteps = 8;
  // Left out: the first steps allocate, fill caches and wait on peers still starting.
  static constexpr int64_t kBusyWarmupSteps = 3;

 private:
  void Write(const v1::TrainerReport& report);
  // Sets what every report carries from earlier calls.
  void FillSticky(v1::TrainerProgress* p) const REQUIRES(mu_);

  int fd_;
  Mutex mu_;
  int64_t last_step_ GUARDED_BY(mu_) = 0;
  double last_loss_ GUARDED_BY(mu_) = 0;  // the last step's, for Phase()
  double last_step_ms_ GUARDED_BY(mu_) = 0;
  double last_tokens_per_s_ GUARDED_BY(mu_) = 0;
  int64_t work_ GUARDED_BY(mu_) = 0;  // Working's reports so far
  int64_t last_checkpoint_step_ GUARDED_BY(mu_) = -1;
  std::string checkpoint_error_ GUARDED_BY(mu_);
  int64_t rollbacks_ GUARDED_BY(mu_) = 0;
  StepExtras last_extras_ GUARDED_BY(mu_);  // the last step's, for Phase()
  double val_loss_ GUARDED_BY(mu_) = 0;
  int64_t val_step_ GUARDED_BY(mu_) = 0;  // 0 before the first evaluation
  double hellaswag_ GUARDED_BY(mu_) = 0;
  int64_t hellaswag_step_ GUARDED_BY(mu_) = 0;  // 0 before the first evaluation
  std::vector<int> cut_off_ranks_ GUARDED_BY(mu_);
  int64_t steps_seen_ GUARDED_BY(mu_) = 0;
  struct WindowStep {
    double busy_ms = 0, step_ms = 0;
  };
  std::deque<WindowStep> window_ GUARDED_BY(mu_);  // the last steps after the warm-up
  double busy_median_ GUARDED_BY(mu_) = 0;
  double pace_median_ GUARDED_BY(mu_) = 0;
};

}  // namespace drover
