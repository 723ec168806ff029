// ProgressHistory: a bounded series of every job's training progress, for the dashboard's
// charts. The coordinator only ever sees each trainer's latest progress (in heartbeats), so
// this is where a curve comes from.
//
// In memory only, on purpose: the complete per-step record is rank 0's
// <output_dir>/metrics.jsonl, written by the trainer; persisting this view would cost a
// SQLite write per job per heartbeat for a chart. A restarted coordinator charts from its
// start on (the page says so).
//
// Bounded twice: at most `capacity` points per series, and at most `max_jobs` jobs (the one
// updated longest ago is forgotten first). A series that reaches its capacity drops every
// other point and from then on keeps only every 2nd report (then every 4th, ...), so it
// always spans the whole run, evenly spaced in reports, in at most `capacity` points (plus
// the newest report, always shown).
//
// Thread-safe: one mutex of its own, never held while calling out. The coordinator records
// under its state lock; the HTTP server reads without it.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "proto/drover.pb.h"

namespace drover::coordinator {

struct ProgressPoint {
  int64_t attempt = 0;
  int64_t step = 0;
  int64_t time_ms = 0;  // wall clock of the heartbeat that carried it
  double loss = 0;
  double lr = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // 0 where the trainer does not know its device's peak
};

// What one evaluation step measured: the validation loss, HellaSwag's accuracy (acc_norm),
// or both; each absent when the job does not measure it.
struct EvalPoint {
  int64_t attempt = 0;
  int64_t step = 0;  // the step the evaluation ran at
  int64_t time_ms = 0;
  std::optional<double> val_loss;
  std::optional<double> hellaswag;
};

// Keeps every stride-th of the values offered, at most `capacity` of them (>= 2), doubling
// the stride whenever it is full. Not thread-safe.
template <typename T>
class Decimated {
 public:
  explicit Decimated(size_t capacity) : capacity_(capacity < 2 ? 2 : capacity) {}
  void Offer(const T& value) {
    if (offered_++ % stride_ != 0) return;
    kept_.push_back(value);
    if (kept_.size() < capacity_) return;
    // Kept values sit at offers 0, s, 2s, ...: the even ones are the multiples of 2s.
    size_t out = 0;
    for (size_t i = 0; i < kept_.size(); i += 2) kept_[out++] = kept_[i];
    kept_.resize(out);
    stride_ *= 2;
  }
  const std::vector<T>& kept() const { return kept_; }
  int64_t stride() const { return stride_; }
  int64_t offered() const { return offered_; }

 private:
  size_t capacity_;
  std::vector<T> kept_;
  int64_t stride_ = 1;
  int64_t offered_ = 0;
};

class ProgressHistory {
 public:
  static constexpr size_t kDefaultCapacity = 2000;
  static constexpr size_t kDefaultMaxJobs = 256;

  explicit ProgressHistory(size_t capacity = kDefaultCapacity, size_t max_jobs = kDefaultMaxJobs);

  // Records the progress rank 0 of the job's current attempt reports, seen at wall time
  // now_ms. A report of the same (attempt, step) as the last one is not a new point (a
  // heartbeat repeats the latest progress until the next step); a step of 0 is no step yet.
  void Record(const std::string& job_id, int64_t attempt, const v1::TrainerProgress& progress,
              int64_t now_ms);
  // Forgets a job (deleted from the state).
  void Forget(const std::string& job_id);

  struct Series {
    // Oldest first; each ends with the newest report, whether decimation kept it or not.
    std::vector<ProgressPoint> points;
    std::vector<EvalPoint> evals;
    int64_t stride = 1;   // points keeps every stride-th report (and the newest)
    int64_t reports = 0;  // distinct steps reported in all
  };
  // The job's series; empty when it never reported (or was forgotten).
  Series Get(const std::string& job_id) const;

 private:
  struct Job {
    explicit Job(size_t capacity) : points(capacity), evals(capacity) {}
    Decimated<ProgressPoint> points;
    Decimated<EvalPoint> evals;
    std::optional<ProgressPoint> latest;
    std::optional<EvalPoint> latest_eval;
    std::list<std::string>::iterator lru;  // its place in lru_
  };

  const size_t capacity_;
  const size_t max_jobs_;
  mutable Mutex mu_;
  std::unordered_map<std::string, Job> jobs_ GUARDED_BY(mu_);
  std::list<std::string> lru_ GUARDED_BY(mu_);  // most recently updated first
};

}  // namespace drover::coordinator
