#include "cli/rpc_client.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>

#include "cli/command.h"
#include "common/files.h"
#include "worker/grpc_util.h"

namespace drover::cli {

namespace {

// 128 random bits as hex: unique enough that two submits never share one.
std::string RandomRequestId() {
  std::random_device rd;
  std::string id;
  char buf[9];
  for (int i = 0; i < 4; ++i) {
    snprintf(buf, sizeof(buf), "%08x", static_cast<unsigned>(rd()));
    id += buf;
  }
  return id;
}

}  // namespace

std::string Submitter() {
  const char* user = std::getenv("USER");
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return std::string(user != nullptr && *user != '\0' ? user : "unknown") + "@" +
         (host[0] != '\0' ? host : "unknown");
}

Status ResolveCredentials(GlobalOptions* globals) {
  ASSIGN_OR_RETURN(globals->tls, LoadTlsCredentials(globals->tls_files, CertNeed::kOptional));
  std::string token;
  std::string source = "$DROVER_TOKEN";
  if (!globals->token_file.empty()) {
    source = "--token-file '" + globals->token_file + "'";
    auto text = ReadFileToString(globals->token_file);
    if (!text.ok()) return InvalidArgumentError(source + ": " + text.status().message());
    token = *text;
  } else if (const char* env = std::getenv("DROVER_TOKEN"); env != nullptr) {
    token = env;
  }
  // A file written by `echo` ends in a newline; that is not part of the token.
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
    token.pop_back();
  }
  if (!globals->token_file.empty() && token.empty()) {
    return InvalidArgumentError(source + " is empty");
  }
  for (char c : token) {
    if (c <= ' ' || c >= 0x7f) {
      return InvalidArgumentError(source +
                                  " holds a blank or a character that is not printable "
                                  "ASCII: a token is one word");
    }
  }
  globals->token = std::move(token);
  return OkStatus();
}

RpcClient::RpcClient(const std::string& address, int64_t timeout_ms, RetryPolicy retry,
                     TlsCredentials tls, std::string token)
    : address_(address),
      tls_(std::move(tls)),
      token_(std::move(token)),
      timeout_ms_(timeout_ms),
      retry_(retry),
      request_id_(RandomRequestId()),
      stub_(v1::JobService::NewStub(MakeChannel(address, tls_))) {}

RpcClient::RpcClient(const GlobalOptions& globals)
    : RpcClient(globals.coordinator, 5000,
                RetryPolicy{static_cast<int64_t>(globals.retry_for_s * 1000)}, globals.tls,
                globals.token) {}

Status RpcClient::Check(const grpc::Status& st, const std::string& what) const {
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
      (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
    // A TLS mismatch looks the same as a coordinator that is down: say what to check.
    return UnavailableError("cannot reach the coordinator at " + address_ + " (" +
                            st.error_message() + "); is drover-coordinator running? " +
                            "(--coordinator or $DROVER_COORDINATOR)" +
                            (tls_.enabled ? "; does its certificate chain to --tls-ca and "
                                            "name that address?"
                                          : "; if it serves TLS, give --tls-ca"));
  }
  return FromGrpcStatus(st, what);
}

Status RpcClient::Call(
    const std::function<grpc::Status(v1::JobService::Stub*, grpc::ClientContext*)>& rpc,
    const std::string& what, bool retry) {
  auto once = [&]() -> Status {
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, timeout_ms_);
    AddBearerToken(&ctx, token_);
    Status st = Check(rpc(stub_.get(), &ctx), what);
    // The next try dials afresh: this channel would wait out its reconnect back-off.
    if (st.code() == StatusCode::kUnavailable) {
      stub_ = v1::JobService::NewStub(MakeChannel(address_, tls_));
    }
    return st;
  };
  return retry ? Retry(retry_, RetryEnv::Real(), once) : once();
}

#define DROVER_RPC_CALL(method, req, resp, what)                                                \
  RETURN_IF_ERROR(Call([&](v1::JobService::Stub* stub,                                          \
                           grpc::ClientContext* ctx) { return stub->method(ctx, req, &resp); }, \
                       what, /*retry=*/true))

StatusOr<std::string> RpcClient::SubmitJob(const std::string& spec_yaml, int priority,
                                           const std::vector<std::string>& after) {
  v1::SubmitJobRequest req;
  for (const std::string& id : after) req.add_after(id);
  req.set_spec_yaml(spec_yaml);
  req.set_priority(priority);
  req.set_submitter(Submitter());
  req.set_request_id(request_id_);
  v1::SubmitJobResponse resp;
  DROVER_RPC_CALL(SubmitJob, req, resp, "submit");
  return resp.job_id();
}

StatusOr<v1::JobInfo> RpcClient::GetJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::JobInfo resp;
  DROVER_RPC_CALL(GetJob, req, resp, "job " + job_id);
  return resp;
}

StatusOr<v1::ListJobsResponse> RpcClient::ListJobs(const v1::ListJobsRequest& request) {
  const v1::ListJobsRequest& req = request;
  v1::ListJobsResponse resp;
  DROVER_RPC_CALL(ListJobs, req, resp, "jobs");
  return resp;
}

StatusOr<v1::CancelJobResponse> RpcClient::CancelJob(const std::string& job_id) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  v1::CancelJobResponse resp;
  DROVER_RPC_CALL(CancelJob, req, resp, "cancel " + job_id);
  return resp;
}

StatusOr<v1::CheckpointJobResponse> RpcClient::CheckpointJob(const std::string& job_id) {
  v1::CheckpointJobRequest req;
  req.set_job_id(job_id);
  v1::CheckpointJobResponse resp;
  DROVER_RPC_CALL(CheckpointJob, req, resp, "checkpoint " + job_id);
  return resp;
}

Status RpcClient::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest req;
  req.set_job_id(job_id);
  v1::DeleteJobResponse resp;
  return Call([&](v1::JobService::Stub* stub,
                  grpc::ClientContext* ctx) { return stub->DeleteJob(ctx, req, &resp); },
              "rm " + job_id, /*retry=*/false);
}

StatusOr<v1::ListWorkersResponse> RpcClient::ListWorkers(bool include_exited) {
  v1::ListWorkersRequest req;
  req.set_include_exited(include_exited);
  v1::ListWorkersResponse resp;
  DROVER_RPC_CALL(ListWorkers, req, resp, "workers");
  return resp;
}

StatusOr<v1::ReadLogsResponse> RpcClient::ReadLogs(const std::string& job_id, int rank,
                                                   int64_t offset) {
  v1::ReadLogsRequest req;
  req.set_job_id(job_id);
  req.set_rank(rank);
  req.set_offset(offset);
  req.set_max_bytes(1 << 20);
  v1::ReadLogsResponse resp;
  DROVER_RPC_CALL(ReadLogs, req, resp, "logs of " + job_id);
  return resp;
}

StatusOr<v1::UncordonResponse> RpcClient::Uncordon(const std::string& node, int slot) {
  v1::UncordonRequest req;
  req.set_node(node);
  req.set_slot_only(slot >= 0);
  req.set_slot(std::max(slot, 0));
  v1::UncordonResponse resp;
  DROVER_RPC_CALL(Uncordon, req, resp, "uncordon " + node);
  return resp;
}

StatusOr<v1::SuspendJobResponse> RpcClient::SuspendJob(const std::string& job_id,
                                                       const std::string& reason, bool now) {
  v1::SuspendJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  req.set_requester(Submitter());
  req.set_now(now);
  v1::SuspendJobResponse resp;
  // Safe to repeat: a job asked to suspend, or suspended, is left as it is.
  DROVER_RPC_CALL(SuspendJob, req, resp, "suspend " + job_id);
  return resp;
}

StatusOr<v1::ResumeJobResponse> RpcClient::ResumeJob(const std::string& job_id) {
  v1::ResumeJobRequest req;
  req.set_job_id(job_id);
  v1::ResumeJobResponse resp;
  // Safe to repeat: a job not suspended is left as it is.
  DROVER_RPC_CALL(ResumeJob, req, resp, "resume " + job_id);
  return resp;
}

StatusOr<v1::SetPriorityResponse> RpcClient::SetPriority(const std::string& job_id, int priority) {
  v1::SetPriorityRequest req;
  req.set_job_id(job_id);
  req.set_priority(priority);
  v1::SetPriorityResponse resp;
  // Safe to repeat: the same priority twice is one change.
  DROVER_RPC_CALL(SetPriority, req, resp, "priority " + job_id);
  return resp;
}

StatusOr<v1::SetTimeLimitResponse> RpcClient::SetTimeLimit(const std::string& job_id,
                                                           double minutes) {
  v1::SetTimeLimitRequest req;
  req.set_job_id(job_id);
  req.set_minutes(minutes);
  v1::SetTimeLimitResponse resp;
  // Safe to repeat: the same limit twice is one change.
  DROVER_RPC_CALL(SetTimeLimit, req, resp, "time-limit " + job_id);
  return resp;
}

StatusOr<v1::CordonResponse> RpcClient::Cordon(const std::string& node, bool drain,
                                               const std::string& reason, int slot, int grace_ms) {
  v1::CordonRequest req;
  req.set_node(node);
  req.set_drain(drain);
  req.set_grace_ms(grace_ms);
  req.set_reason(reason);
  req.set_requester(Submitter());
  if (slot >= 0) {
    req.set_slot_only(true);
    req.set_slot(slot);
  }
  v1::CordonResponse resp;
  // Safe to repeat: a second cordon or drain of a node (or slot) changes nothing.
  DROVER_RPC_CALL(
      Cordon, req, resp,
      (drain ? "drain " : "cordon ") + node + (slot >= 0 ? " slot " + std::to_string(slot) : ""));
  return resp;
}

#undef DROVER_RPC_CALL

int ReportError(const Status& st) {
  std::cerr << "drover: " << st.message() << "\n";
  return st.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "{}";
  return out;
}

std::string FormatTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  };
  measure(header);
  for (const auto& row : rows) measure(row);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  };
  emit(header);
  for (const auto& row : rows) emit(row);
  return out;
}

std::string JobStateName(v1::JobState state) {
  const std::string& name = v1::JobState_Name(state);
  return name.empty() ? "UNKNOWN" : name;
}

}  // namespace drover::cli
