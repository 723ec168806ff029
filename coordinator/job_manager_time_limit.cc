// JobManager's time limits (job_manager.h, "Time limits"): resources.time_limit_minutes.
#include <spdlog/spdlog.h>

#include <cmath>

#include "common/duration.h"
#include "common/job_state.h"
#include "coordinator/job_manager.h"

namespace drover::coordinator {

int64_t JobManager::TimeLimitMs(const Job& job) {
  return MinutesToMs(job.spec.resources.time_limit_minutes);
}

int64_t JobManager::RanMs(const Job& job, int64_t now_ms) const {
  int64_t ran = 0;
  for (const auto& [number, a] : job.attempts) ran += AttemptRanMs(job.rec, a, now_ms);
  return ran;
}

std::vector<SlotRelease> JobManager::TimedReleases() const {
  std::vector<SlotRelease> out;
  const int64_t now = clock_->WallNowMs();
  for (const auto& [seq, id] : live_) {
    const Job& job = *Get(id);
    const int64_t limit = TimeLimitMs(job);
    if (job.rec.state() != v1::RUNNING || limit <= 0) continue;
    out.push_back({job.rec.device(), job.rec.placement_size(),
                   std::max<int64_t>(0, limit - RanMs(job, now))});
  }
  return out;
}

bool JobManager::TimeUsedUp(const Job& job, int64_t now_ms) const {
  const int64_t limit = TimeLimitMs(job);
  return limit > 0 && RanMs(job, now_ms) >= limit;
}

std::string JobManager::TimeLimitReached(const Job& job, int64_t now_ms) const {
  return "time limit reached: it ran " + FormatDurationMs(RanMs(job, now_ms)) + " of its " +
         FormatDurationMs(TimeLimitMs(job)) + " (resources.time_limit_minutes)";
}

void JobManager::EndAtTimeLimit(Job& job, const std::string& how, int64_t now_ms) {
  // Counted before the attempt ends: EndAttempt ends it at now_ms, which counts the same.
  const std::string reached = TimeLimitReached(job, now_ms);
  v1::AttemptRecord* attempt = nullptr;
  if (job.rec.state() == v1::RUNNING) attempt = &EndAttempt(job, "time limit reached", now_ms);
  job.rec.set_state(v1::FAILED);
  job.rec.set_finished_ms(now_ms);
  job.rec.set_reason(reached + "; " + how);
  job.failure.clear();
  job.waiting.clear();
  job.time_up = false;
  spdlog::warn("job {}: {}", job.rec.job_id(), job.rec.reason());
  Persist(job, attempt);
}

std::vector<std::string> JobManager::CheckTimeLimits(int64_t now_ms) {
  // Found first: ending a job takes it out of live_.
  std::vector<Job*> due;
  for (const auto& [seq, id] : live_) {
    Job& job = *Get(id);
    // A suspended job uses no time; resumed, it is ended here before it is placed again.
    if (job.rec.state() != v1::SUSPENDED && TimeUsedUp(job, now_ms)) due.push_back(&job);
  }
  std::vector<std::string> asked;
  for (Job* job : due) {
    const FaultToleranceSpec& ft = job->spec.fault_tolerance;
    if (job->rec.state() != v1::RUNNING) {
      EndAtTimeLimit(*job, "not placed again", now_ms);
    } else if (!job->spec.checkpoint.enabled()) {
      EndAtTimeLimit(*job, "stopped at once (it saves no checkpoints)", now_ms);
    } else if (!job->time_up) {
      job->time_up = true;
      job->resize.reset();
      job->replace.reset();
      AskCheckpoint(*job, "time limit reached", /*for_resize=*/false);
      UpdateReason(*job);
      spdlog::info("job {}: {}", job->rec.job_id(), job->rec.reason());
      asked.push_back(job->rec.job_id());
    } else if (const int64_t hang_ms = std::llround(ft.hang_timeout_s * 1000);
               RanMs(*job, now_ms) >= TimeLimitMs(*job) + hang_ms) {
      const int64_t newest = job->rec.latest_checkpoint_step();
      EndAtTimeLimit(
          *job,
          "stopped at once: the checkpoint asked for at the limit did not come within "
          "fault_tolerance.hang_timeout_s (" +
              FormatDurationMs(hang_ms) + "); " +
              (newest >= 0 ? "its newest complete checkpoint is of step " + std::to_string(newest)
                           : std::string("it has no complete checkpoint")),
          now_ms);
    }
  }
  return asked;
}

}  // namespace drover::coordinator
