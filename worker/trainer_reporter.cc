#include "worker/trainer_reporter.h"

#include <google/protobuf/util/json_util.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "common/median.h"
#include "worker/trainer_env.h"

namespace drover {

TrainerReporter TrainerReporter::FromEnv() {
  const char* v = std::getenv(kEnvStatusFd);
  if (v == nullptr || *v == '\0') return TrainerReporter(-1);
  int fd = -1;
  auto [ptr, ec] = std::from_chars(v, v + std::strlen(v), fd);
  if (ec != std::errc() || *ptr != '\0' || fd < 0) return TrainerReporter(-1);
  return TrainerReporter(fd);
}

void TrainerReporter::Progress(int64_t step, double step_ms, double loss, double tokens_per_s,
                               const StepExtras& extras, const std::string& message) {
  v1::TrainerReport report;
  v1::TrainerProgress* p = report.mutable_progress();
  p->set_step(step);
  p->set_step_ms(step_ms);
  p->set_loss(loss);
  p->set_tokens_per_s(tokens_per_s);
  p->set_message(message);
  {
    MutexLock lock(&mu_);
    last_step_ = step;
    last_loss_ = loss;
    last_step_ms_ = step_ms;
    last_tokens_per_s_ = tokens_per_s;
    last_extras_ = extras;
    if (++steps_seen_ > kBusyWarmupSteps) {
      window_.push_back({extras.busy_ms, step_ms});
      if (window_.size() > kBusyWindow) window_.pop_front();
    }
    const bool enough = window_.size() >= kBusyMinSteps;
    auto median = [](const std::deque<WindowStep>& window, double WindowStep::*field) {
      std::vector<double> values;
      for (const WindowStep& s : window) values.push_back(s.*field);
      return Median(std::move(values));
    };
    busy_median_ = enough ? median(window_, &WindowStep::busy_ms) : 0;
    pace_median_ = enough ? median(window_, &WindowStep::step_ms) : 0;
    if (extras.val_loss.has_value()) {
      val_loss_ = *extras.val_loss;
      val_step_ = step;
    }
    if (extras.hellaswag.has_value()) {
      hellaswag_ = *extras.hellaswag;
      hellaswag_step_ = step;
    }
    FillSticky(p);
  }
  Write(report);
}

void TrainerReporter::FillSticky(v1::TrainerProgress* p) const {
  p->set_lr(last_extras_.lr);
  p->set_mfu(last_extras_.mfu);
  p->set_busy_ms(busy_median_);
  p->set_pace_ms(pace_median_);
  p->set_pp_stage(last_extras_.pp_stage);
  p->set_val_loss(val_loss_);
  p->set_val_step(val_step_);
  p->set_hellaswag(hellaswag_);
  p->set_hellaswag_step(hellaswag_step_);
  p->set_last_checkpoint_step(last_checkpoint_step_);
  p->set_checkpoint_error(checkpoint_error_);
  p->set_rollbacks(rollbacks_);
  p->set_work(work_);
  for (int r : cut_off_ranks_) p->add_cut_off_ranks(r);
}

void TrainerReporter::Phase(const std::string& message) {
  v1::TrainerReport report;
  v1::TrainerProgress* p = report.mutable_progress();
  p->set_message(message);
  {
    MutexLock lock(&mu_);
    p->set_step(last_step_);
    p->set_loss(last_loss_);
    p->set_step_ms(last_step_ms_);
    p->set_tokens_per_s(last_tokens_per_s_);
    FillSticky(p);
  }
  Write(report);
}

void TrainerReporter::Working(const std::string& message) {
  {
    MutexLock lock(&mu_);
    ++work_;
  }
  Phase(message);
}

void TrainerReporter::RolledBack(int64_t spike_step, int64_t to_step, int64_t rollbacks) {
  {
    MutexLock lock(&mu_);
    rollbacks_ = rollbacks;
    last_step_ = to_step;
  }
  Phase("loss spike at step " + std::to_string(spike_step) + ": rolled back to step " +
        std::to_string(to_step));
}

void TrainerReporter::CheckpointFailed(const std::string& error) {
  {
    MutexLock lock(&mu_);
    checkpoint_error_ = error;
  }
  Phase("checkpoint failed");
}

void TrainerReporter::Checkpoint(const v1::CheckpointRecord& record) {
  v1::TrainerReport report;
  *report.mutable_checkpoint() = record;
  {
    MutexLock lock(&mu_);
    if (record.step() > last_checkpoint_step_) last_checkpoint_step_ = record.step();
    checkpoint_error_.clear();
  }
  Write(report);
}

void TrainerReporter::CutOff(const std::vector<int>& ranks) {
  {
    MutexLock lock(&mu_);
    cut_off_ranks_ = ranks;
  }
  Phase("ranks cut off from their peers");
}

void TrainerReporter::Done() {
  v1::TrainerReport report;
  report.set_done(true);
  Write(report);
}

void TrainerReporter::Write(const v1::TrainerReport& report) {
  if (fd_ < 0) return;
  std::string line;
  if (!google::protobuf::util::MessageToJsonString(report, &line).ok()) return;
  line.push_back('\n');
  MutexLock lock(&mu_);
  size_t done = 0;
  while (done < line.size()) {
    // The agent hands out a socket: MSG_NOSIGNAL turns a vanished reader into EPIPE
    // instead of a SIGPIPE that would kill the trainer. Plain fds fall back to write().
    ssize_t n = send(fd_, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) n = write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace drover
