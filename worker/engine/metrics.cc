#include "worker/engine/metrics.h"

#include <cerrno>
#include <cmath>
#include <filesystem>

namespace drover::engine {
namespace {

void AppendNumber(std::string* out, const char* key, double v) {
  char buf[64];
  if (std::isfinite(v)) {
    std::snprintf(buf, sizeof(buf), "\"%s\":%.9g", key, v);
  } else {
    std::snprintf(buf, sizeof(buf), "\"%s\":null", key);
  }
  if (out->size() > 1) out->push_back(',');
  out->append(buf);
}

void AppendInt(std::string* out, const char* key, int64_t v) {
  if (out->size() > 1) out->push_back(',');
  out->append("\"").append(key).append("\":").append(std::to_string(v));
}

}  // namespace

std::string StepMetricsToJson(const StepMetrics& m) {
  std::string s = "{";
  AppendInt(&s, "step", m.step);
  AppendNumber(&s, "loss", m.loss);
  AppendNumber(&s, "lr", m.lr);
  AppendNumber(&s, "grad_norm", m.grad_norm);
  AppendNumber(&s, "tokens_per_s", m.tokens_per_s);
  AppendNumber(&s, "step_ms", m.step_ms);
  AppendInt(&s, "world_size", m.world_size);
  AppendInt(&s, "attempt", m.attempt);
  AppendNumber(&s, "data_wait_ms", m.data_wait_ms);
  AppendInt(&s, "dp", m.dp);
  AppendInt(&s, "pp", m.pp);
  AppendInt(&s, "tp", m.tp);
  AppendInt(&s, "pp_chunks", m.pp_chunks);
  AppendInt(&s, "zero_stage", m.zero_stage);
  AppendInt(&s, "dp_shard", m.dp_shard);
  AppendNumber(&s, "comm_ms", m.comm_ms);
  AppendNumber(&s, "comm_wait_ms", m.comm_wait_ms);
  AppendNumber(&s, "publish_ms", m.publish_ms);
  AppendNumber(&s, "pp_wait_ms", m.pp_wait_ms);
  AppendNumber(&s, "peer_wait_ms", m.peer_wait_ms);
  AppendNumber(&s, "busy_ms", m.busy_ms);
  AppendNumber(&s, "param_mib", m.param_mib);
  AppendNumber(&s, "grad_mib", m.grad_mib);
  AppendNumber(&s, "optimizer_mib", m.optimizer_mib);
  AppendNumber(&s, "working_mib", m.working_mib);
  AppendNumber(&s, "activation_mib", m.activation_mib);
  if (m.mfu.has_value()) AppendNumber(&s, "mfu", *m.mfu);
  if (m.val_loss.has_value()) AppendNumber(&s, "val_loss", *m.val_loss);
  if (m.hellaswag.has_value()) AppendNumber(&s, "hellaswag", *m.hellaswag);
  if (m.rollbacks > 0) AppendInt(&s, "rollbacks", m.rollbacks);
  if (m.spike) s += ",\"spike\":true";
  if (m.loss_scale.has_value()) AppendNumber(&s, "loss_scale", *m.loss_scale);
  if (m.skipped) s += ",\"skipped\":true";
  if (m.device_allocations.has_value()) {
    AppendInt(&s, "device_allocations", *m.device_allocations);
  }
  if (m.device_mib.has_value()) AppendNumber(&s, "device_mib", *m.device_mib);
  if (m.device_peak_mib.has_value()) AppendNumber(&s, "device_peak_mib", *m.device_peak_mib);
  s.push_back('}');
  return s;
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status MetricsWriter::Open(const std::string& path) {
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return UnavailableError("cannot create directory for " + path + ": " + ec.message());
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return ErrnoToStatus(errno, "open metrics file " + path);
  if (file_ != nullptr) std::fclose(file_);
  file_ = f;
  path_ = path;
  return OkStatus();
}

Status MetricsWriter::Append(const StepMetrics& m) {
  if (file_ == nullptr) return FailedPreconditionError("metrics file is not open");
  std::string line = StepMetricsToJson(m);
  line.push_back('\n');
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return ErrnoToStatus(errno, "write metrics file " + path_);
  }
  return OkStatus();
}

}  // namespace drover::engine
