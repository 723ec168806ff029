// LogStore: the coordinator's copy of every trainer's output, one file per job and rank:
// <root>/<job>/rank-<r>.log, appended across attempts, served in byte ranges.
//
// Agents ship their local log with its byte offset and retry on failure, so appends are
// deduplicated by offset per (job, attempt, rank): a chunk whose bytes were already
// appended is dropped, an overlapping one contributes only its new tail. The offset of the
// next byte is kept beside each log (rank-<r>.log.next, the latest attempt's), so this
// holds across a coordinator restart too.
//
// Thread-safe (one internal mutex, held across the file append so chunks never
// interleave; it guards nothing else, so the coordinator's state lock is never held here).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "common/mutex.h"
#include "common/status.h"

namespace drover::coordinator {

class LogStore {
 public:
  explicit LogStore(std::string root);

  Status Append(const std::string& job_id, int64_t attempt, int rank, int64_t offset,
                const std::string& data);

  struct Chunk {
    std::string data;
    int64_t next_offset = 0;
  };
  // Up to max_bytes from `offset` of the job's rank log. A log not written yet reads empty.
  StatusOr<Chunk> Read(const std::string& job_id, int rank, int64_t offset, int64_t max_bytes);

  // Deletes the job's logs (the job was deleted). A missing log is not an error.
  Status Remove(const std::string& job_id);

  // True when `job_id` may be used as a directory name (no '/', no "..", short).
  static bool ValidJobId(const std::string& job_id);

 private:
  std::string PathOf(const std::string& job_id, int rank) const;
  // The next offset the sidecar records for (job, attempt, rank); 0 when none or torn.
  int64_t LoadNext(const std::string& job_id, int64_t attempt, int rank) const;

  const std::string root_;
  Mutex mu_;
  // (job, attempt, rank) -> agent-side offset of the next byte not yet appended.
  std::map<std::tuple<std::string, int64_t, int>, int64_t> next_offset_ GUARDED_BY(mu_);
};

}  // namespace drover::coordinator
