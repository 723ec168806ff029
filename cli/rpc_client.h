// The CLI's connection to the coordinator: one JobService stub with a deadline per call,
// gRPC errors translated to Status (worker/grpc_util.h), JSON and table output helpers.
//
// Every call but DeleteJob is safe to repeat and is retried while the coordinator is
// unreachable (cli/retry.h), each time on a freshly dialled channel (a channel that failed
// waits out its own reconnect back-off). A submit is safe to repeat because it carries a
// request id chosen once per RpcClient: the coordinator returns the job that id already
// made instead of making a second one. A delete is not retried: a retry after a delete
// that succeeded unseen would say "no job".
#pragma once

#include <google/protobuf/message.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/progress.h"
#include "cli/retry.h"
#include "common/status.h"
#include "proto/drover.grpc.pb.h"

namespace drover::cli {

class RpcClient {
 public:
  // Plaintext without a token unless `tls` and `token` say otherwise.
  explicit RpcClient(const std::string& address, int64_t timeout_ms = 5000, RetryPolicy retry = {},
                     TlsCredentials tls = {}, std::string token = "");
  // To --coordinator, retrying for --retry-for, with the credentials in `globals`.
  explicit RpcClient(const GlobalOptions& globals);

  // Fills in the submitter ($USER@hostname) and this client's request id.
  // `after`: jobs it runs after (SubmitJobRequest.after).
  StatusOr<std::string> SubmitJob(const std::string& spec_yaml, int priority,
                                  const std::vector<std::string>& after = {});
  StatusOr<v1::JobInfo> GetJob(const std::string& job_id);
  StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request = {});
  StatusOr<v1::CancelJobResponse> CancelJob(const std::string& job_id);
  StatusOr<v1::SuspendJobResponse> SuspendJob(const std::string& job_id, const std::string& reason,
                                              bool now);
  StatusOr<v1::ResumeJobResponse> ResumeJob(const std::string& job_id);
  StatusOr<v1::SetPriorityResponse> SetPriority(const std::string& job_id, int priority);
  StatusOr<v1::SetTimeLimitResponse> SetTimeLimit(const std::string& job_id, double minutes);
  StatusOr<v1::CheckpointJobResponse> CheckpointJob(const std::string& job_id);
  Status DeleteJob(const std::string& job_id);
  StatusOr<v1::ListWorkersResponse> ListWorkers(bool include_exited = false);
  StatusOr<v1::ReadLogsResponse> ReadLogs(const std::string& job_id, int rank, int64_t offset);
  // slot < 0: the whole node.
  StatusOr<v1::UncordonResponse> Uncordon(const std::string& node, int slot);
  // Fills in the requester ($USER@hostname), as a submit's submitter. slot >= 0: only that
  // slot (with `drain`: the job with a rank there moves it off). grace_ms > 0: a node's
  // drain gives its trainers that long to leave (CordonRequest.grace_ms).
  StatusOr<v1::CordonResponse> Cordon(const std::string& node, bool drain,
                                      const std::string& reason, int slot = -1, int grace_ms = 0);

  const std::string& request_id() const { return request_id_; }

 private:
  // One call of `rpc` (a lambda calling the stub), retried while UNAVAILABLE when `retry`.
  Status Call(const std::function<grpc::Status(v1::JobService::Stub*, grpc::ClientContext*)>& rpc,
              const std::string& what, bool retry);
  Status Check(const grpc::Status& st, const std::string& what) const;

  std::string address_;
  TlsCredentials tls_;
  std::string token_;
  int64_t timeout_ms_;
  RetryPolicy retry_;
  std::string request_id_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// Reads what --tls-* and --token-file (else $DROVER_TOKEN) name into globals->tls and
// globals->token. InvalidArgument naming the flag when a file is missing or malformed.
Status ResolveCredentials(GlobalOptions* globals);

// "$USER@hostname", who a submit says it comes from.
std::string Submitter();

// Prints `st` as one line on stderr and returns the exit code for it: 1 for runtime
// failures (unreachable coordinator, unknown job), 2 for invalid input.
int ReportError(const Status& st);

// Protobuf JSON (field names as in the .proto, defaults included) for scripts.
std::string ToJson(const google::protobuf::Message& message);

// An aligned text table: the header row, then `rows`.
std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

// "RUNNING" from v1::RUNNING. (Durations: FormatDurationMs, cli/progress.h.)
std::string JobStateName(v1::JobState state);

}  // namespace drover::cli
