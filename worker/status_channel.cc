#include "worker/status_channel.h"

#include <google/protobuf/util/json_util.h>

namespace drover {

Status ApplyReportLine(const std::string& line, int64_t now_wall_ms, v1::TrainerStatus* status,
                       std::vector<v1::CheckpointRecord>* checkpoints) {
  v1::TrainerReport report;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // a newer trainer may report more
  auto parsed = google::protobuf::util::JsonStringToMessage(line, &report, options);
  if (!parsed.ok()) {
    return InvalidArgumentError("bad trainer report line '" + line.substr(0, 200) +
                                "': " + std::string(parsed.message()));
  }
  if (report.has_progress()) {
    const int64_t old_step = status->progress().step();
    const int64_t old_ckpt = status->progress().last_checkpoint_step();
    *status->mutable_progress() = report.progress();
    if (report.progress().last_checkpoint_step() < old_ckpt) {
      status->mutable_progress()->set_last_checkpoint_step(old_ckpt);
    }
    if (report.progress().step() != old_step) status->set_last_progress_ms(now_wall_ms);
    if (status->state() == v1::TRAINER_STARTING) status->set_state(v1::TRAINER_RUNNING);
  }
  if (report.has_checkpoint()) {
    v1::CheckpointRecord record = report.checkpoint();
    if (record.job_id().empty()) record.set_job_id(status->job_id());
    if (record.attempt() == 0) record.set_attempt(status->attempt());
    if (record.created_ms() == 0) record.set_created_ms(now_wall_ms);
    if (record.step() > status->progress().last_checkpoint_step()) {
      status->mutable_progress()->set_last_checkpoint_step(record.step());
    }
    checkpoints->push_back(std::move(record));
  }
  if (report.done()) status->mutable_progress()->set_message("done");
  return OkStatus();
}

std::vector<std::string> TakeLines(std::string* buffer) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl = buffer->find('\n'); nl != std::string::npos; nl = buffer->find('\n', start)) {
    if (nl > start) lines.push_back(buffer->substr(start, nl - start));
    start = nl + 1;
  }
  buffer->erase(0, start);
  return lines;
}

}  // namespace drover
