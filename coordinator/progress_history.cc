#include "coordinator/progress_history.h"

#include <algorithm>

namespace drover::coordinator {

ProgressHistory::ProgressHistory(size_t capacity, size_t max_jobs)
    : capacity_(capacity), max_jobs_(max_jobs < 1 ? 1 : max_jobs) {}

void ProgressHistory::Record(const std::string& job_id, int64_t attempt,
                             const v1::TrainerProgress& progress, int64_t now_ms) {
  if (progress.step() <= 0) return;
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    if (jobs_.size() >= max_jobs_) {
      jobs_.erase(lru_.back());
      lru_.pop_back();
    }
    it = jobs_.emplace(job_id, Job(capacity_)).first;
    lru_.push_front(job_id);
    it->second.lru = lru_.begin();
  }
  Job& job = it->second;
  lru_.splice(lru_.begin(), lru_, job.lru);
  if (!job.latest || job.latest->attempt != attempt || job.latest->step != progress.step()) {
    ProgressPoint p{attempt,       progress.step(),         now_ms,        progress.loss(),
                    progress.lr(), progress.tokens_per_s(), progress.mfu()};
    job.points.Offer(p);
    job.latest = p;
  }
  // An evaluation step reports both of what it measured at once; each rides along, sticky,
  // with the steps after it.
  const int64_t eval_step = std::max(progress.val_step(), progress.hellaswag_step());
  if (eval_step > 0 && (!job.latest_eval || job.latest_eval->attempt != attempt ||
                        job.latest_eval->step != eval_step)) {
    EvalPoint e{attempt, eval_step, now_ms, std::nullopt, std::nullopt};
    if (progress.val_step() == eval_step) e.val_loss = progress.val_loss();
    if (progress.hellaswag_step() == eval_step) e.hellaswag = progress.hellaswag();
    job.evals.Offer(e);
    job.latest_eval = e;
  }
}

void ProgressHistory::Forget(const std::string& job_id) {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  lru_.erase(it->second.lru);
  jobs_.erase(it);
}

ProgressHistory::Series ProgressHistory::Get(const std::string& job_id) const {
  Series s;
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return s;
  const Job& job = it->second;
  s.points = job.points.kept();
  s.evals = job.evals.kept();
  // The newest report may fall between kept ones: a live chart must end where training is.
  if (job.latest && (s.points.empty() || s.points.back().attempt != job.latest->attempt ||
                     s.points.back().step != job.latest->step)) {
    s.points.push_back(*job.latest);
  }
  if (job.latest_eval && (s.evals.empty() || s.evals.back().attempt != job.latest_eval->attempt ||
                          s.evals.back().step != job.latest_eval->step)) {
    s.evals.push_back(*job.latest_eval);
  }
  s.stride = job.points.stride();
  s.reports = job.points.offered();
  return s;
}

}  // namespace drover::coordinator
