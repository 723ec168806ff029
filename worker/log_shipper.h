// LogShipper: copies trainer log files to the coordinator with AppendLogs, from a
// background thread.
//
// Shipping is offset-based: each request carries the byte offset of its data in the local
// file and the offset only advances after the coordinator accepted the chunk, so a failed
// or repeated send is retried from the same place (the coordinator de-duplicates by
// offset). A file whose trainer exited is dropped once it is shipped to the end.
//
// Thread-safety: Add/Finish/ShipOnce may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/status.h"
#include "proto/drover.pb.h"
#include "worker/trainer_supervisor.h"

namespace drover {

class LogShipper {
 public:
  using Sender = std::function<Status(const v1::AppendLogsRequest&)>;

  LogShipper(Sender sender, int64_t poll_ms = 200, size_t max_chunk = 256 * 1024);
  ~LogShipper();  // stops the thread (call Start() to run one)

  void Start();

  // Begins shipping `path` for a trainer.
  void Add(const TrainerKey& key, const std::string& path);
  // The trainer exited: ship what is left, then forget the file.
  void Finish(const TrainerKey& key);

  // One pass over every file; returns the number of bytes accepted by the sender.
  size_t ShipOnce();

  // Bytes of `key`'s file accepted so far (for tests), or -1 when unknown.
  int64_t ShippedOffset(const TrainerKey& key) const;

 private:
  struct File {
    std::string path;
    int64_t offset = 0;
    bool finished = false;
  };

  void Loop();

  Sender sender_;
  const int64_t poll_ms_;
  const size_t max_chunk_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<TrainerKey, File> files_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  Mutex ship_mu_;  // one pass at a time
  std::thread thread_;
};

}  // namespace drover
