// What one caller may send the coordinator. Everything here ends up in its memory, in its
// state store, or in messages it sends to others (orders, lists), so each is bounded: no
// reply or order may grow with what one caller submitted. A request over a limit is
// refused with an error that names the limit.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"

namespace drover::coordinator {

// A job spec, in bytes (comments included): it is stored and sent with every start order.
inline constexpr size_t kMaxSpecBytes = 256 * 1024;
// A job's name is bounded where specs are validated (common/job_spec_validate.cc).
// SubmitJobRequest.submitter and .request_id, in bytes: kept with the job.
inline constexpr size_t kMaxSubmitterBytes = 256;
inline constexpr size_t kMaxRequestIdBytes = 128;
// SubmitJobRequest.after: the jobs one job runs after, and the length of one's id (drover's
// are 13 bytes: j-000001-46c8).
inline constexpr int kMaxAfterJobs = 16;
inline constexpr size_t kMaxJobIdBytes = 64;
// A node's name, agent id and node uid at registration, in bytes: in every worker listing
// and every placement.
inline constexpr size_t kMaxNodeNameBytes = 128;
inline constexpr size_t kMaxNodeAddressBytes = 256;
inline constexpr int kMaxSlotsPerNode = 1024;
// An operator's reason and name in a CordonRequest, in bytes: kept in the node's record.
inline constexpr size_t kMaxReasonBytes = 1024;
// One AppendLogs chunk, in bytes. Agents ship at most 256 KiB at a time (LogShipper).
inline constexpr size_t kMaxLogChunkBytes = 1024 * 1024;
// Default of --max-pending-per-submitter: jobs one submitter may have PENDING at once.
inline constexpr int kDefaultMaxPendingPerSubmitter = 1000;

// INVALID_ARGUMENT naming the field and its limit when `value` is longer than `max` bytes.
inline Status CheckLength(const std::string& what, const std::string& value, size_t max) {
  if (value.size() <= max) return OkStatus();
  return InvalidArgumentError(what + " is " + std::to_string(value.size()) + " bytes; at most " +
                              std::to_string(max) + " are accepted");
}

}  // namespace drover::coordinator
