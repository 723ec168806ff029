// drover jobs [--json]: every job the coordinator knows, newest last.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

std::string StepText(const v1::JobRecord& job) {
  if (job.last_step() <= 0) return "-";
  return std::to_string(job.last_step());
}

CommandRun SetupJobs(CLI::App* app, GlobalOptions* globals) {
  app->add_flag("--json", globals->json, "protobuf JSON for scripts");
  return [globals]() -> int {
    RpcClient client(globals->coordinator);
    auto jobs = client.ListJobs();
    if (!jobs.ok()) return ReportError(jobs.status());
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
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("jobs", "List jobs", SetupJobs);

}  // namespace drover::cli
