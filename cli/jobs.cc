// drover jobs [--state S]... [--name N] [--limit N | --all] [--json]: the jobs the
// coordinator knows, newest first, a page at a time (ListJobsRequest).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

std::string StepText(const v1::JobRecord& job) {
  if (job.last_step() <= 0) return "-";
  return std::to_string(job.last_step());
}

struct JobsOptions {
  std::vector<std::string> states;
  std::string name;
  int limit = 20;
  bool all = false;
};

CommandRun SetupJobs(CLI::App* app, GlobalOptions* globals) {
  auto o = std::make_shared<JobsOptions>();
  app->add_flag("--json", globals->json, "protobuf JSON for scripts");
  app->add_option("--state", o->states,
                  "only jobs in this state (repeatable): pending, running, ...");
  app->add_option("--name", o->name, "only jobs of this name");
  app->add_option("--limit", o->limit, "at most this many, newest first")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app->add_flag("--all", o->all, "every job (fetched a page at a time)");
  return [globals, o]() -> int {
    v1::ListJobsRequest req;
    req.set_name(o->name);
    for (std::string s : o->states) {
      for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      v1::JobState state;
      if (!v1::JobState_Parse(s, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
        return ReportError(InvalidArgumentError(
            "--state '" + s +
            "' is not a job state; use pending, running, recovering, suspended, "
            "succeeded, failed or cancelled"));
      }
      req.add_states(state);
    }
    RpcClient client(*globals);
    const int64_t want = o->all ? INT64_MAX : o->limit;
    v1::ListJobsResponse listed;
    auto jobs = StatusOr<v1::ListJobsResponse>(listed);
    while (true) {
      req.set_limit(static_cast<int32_t>(std::min<int64_t>(1000, want - listed.jobs_size())));
      jobs = client.ListJobs(req);
      if (!jobs.ok()) return ReportError(jobs.status());
      for (auto& j : *jobs->mutable_jobs()) *listed.add_jobs() = std::move(j);
      listed.set_next_before_seq(jobs->next_before_seq());
      if (jobs->next_before_seq() == 0 || listed.jobs_size() >= want) break;
      req.set_before_seq(jobs->next_before_seq());
    }
    jobs = listed;
    if (globals->json) {
      std::cout << ToJson(*jobs);
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows;
    for (const v1::JobRecord& j : jobs->jobs()) {
      char loss[32] = "-";
      if (j.last_step() > 0) snprintf(loss, sizeof(loss), "%.4f", j.last_loss());
      rows.push_back({j.job_id(), j.name(), JobStateName(j.state()), std::to_string(j.attempt()),
                      std::to_string(j.restarts()) + "/" + std::to_string(j.max_restarts()),
                      std::to_string(j.placement_size()), StepText(j), loss, j.reason()});
    }
    std::cout << FormatTable(
        {"JOB", "NAME", "STATE", "ATTEMPT", "RESTARTS", "WORLD", "STEP", "LOSS", "REASON"}, rows);
    if (jobs->next_before_seq() != 0) {
      std::cout << "(older jobs not shown: --limit N or --all)\n";
    }
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("jobs", "List jobs", SetupJobs);

}  // namespace drover::cli
