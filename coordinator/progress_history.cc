#include "coordinator/progress_history.h"

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
  if (progress.val_step() > 0 && (!job.latest_val || job.latest_val->attempt != attempt ||
                                  job.latest_val->step != progress.val_step())) {
    ValPoint v{attempt, progress.val_step(), now_ms, progress.val_loss()};
    job.val.Offer(v);
    job.latest_val = v;
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
  s.val = job.val.kept();
  // The newest report may fall between kept ones: a live chart must end where training is.
  if (job.latest && (s.points.empty() || s.points.back().attempt != job.latest->attempt ||
                     s.points.back().step != job.latest->step)) {
    s.points.push_back(*job.latest);
  }
  if (job.latest_val && (s.val.empty() || s.val.back().attempt != job.latest_val->attempt ||
                         s.val.back().step != job.latest_val->step)) {
    s.val.push_back(*job.latest_val);
  }
  s.stride = job.points.stride();
  s.reports = job.points.offered();
  return s;
}

}  // namespace drover::coordinator
