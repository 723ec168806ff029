#include "worker/log_shipper.h"

#include <fstream>
#include <vector>

namespace drover {

LogShipper::LogShipper(Sender sender, int64_t poll_ms, size_t max_chunk)
    : sender_(std::move(sender)), poll_ms_(poll_ms), max_chunk_(max_chunk) {}

LogShipper::~LogShipper() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void LogShipper::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void LogShipper::Add(const TrainerKey& key, const std::string& path) {
  MutexLock lock(&mu_);
  if (files_.count(key) == 0) files_[key] = File{path, 0, false};
}

void LogShipper::Finish(const TrainerKey& key) {
  {
    MutexLock lock(&mu_);
    auto it = files_.find(key);
    if (it != files_.end()) it->second.finished = true;
  }
  cv_.SignalAll();  // ship the tail now rather than at the next poll
}

int64_t LogShipper::ShippedOffset(const TrainerKey& key) const {
  MutexLock lock(&mu_);
  auto it = files_.find(key);
  return it == files_.end() ? -1 : it->second.offset;
}

size_t LogShipper::ShipOnce() {
  MutexLock pass(&ship_mu_);
  std::map<TrainerKey, File> snapshot;
  {
    MutexLock lock(&mu_);
    snapshot = files_;
  }
  size_t shipped = 0;
  std::vector<char> buf(max_chunk_);
  for (auto& [key, file] : snapshot) {
    std::ifstream in(file.path, std::ios::binary);
    bool at_end = !in.good();  // a missing file has nothing to ship
    int64_t offset = file.offset;
    bool failed = false;
    while (in.good()) {
      in.seekg(offset);
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      std::streamsize n = in.gcount();
      if (n <= 0) {
        at_end = true;
        break;
      }
      v1::AppendLogsRequest req;
      req.set_job_id(key.job_id);
      req.set_attempt(key.attempt);
      req.set_rank(key.rank);
      req.set_offset(offset);
      req.set_data(buf.data(), static_cast<size_t>(n));
      if (!sender_(req).ok()) {
        failed = true;  // retried from the same offset next pass
        break;
      }
      offset += n;
      shipped += static_cast<size_t>(n);
      if (static_cast<size_t>(n) < buf.size()) {
        at_end = true;
        break;
      }
      in.clear();
    }
    MutexLock lock(&mu_);
    auto it = files_.find(key);
    if (it == files_.end()) continue;
    it->second.offset = offset;
    // Finished is read from the live entry: a Finish() during this pass must not drop a
    // tail written after our read.
    if (!failed && at_end && file.finished && it->second.finished) files_.erase(it);
  }
  return shipped;
}

void LogShipper::Loop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    lock.Unlock();
    ShipOnce();
    lock.Lock();
    cv_.WaitFor(&mu_, std::chrono::milliseconds(poll_ms_));
  }
}

}  // namespace drover
