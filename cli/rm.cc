// drover rm JOB...: deletes finished jobs from the coordinator's state (record, attempts,
// checkpoint records, its copy of the logs). The job's output_dir and checkpoint files are
// the user's and stay. A job that has not finished is refused: cancel it first.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

CommandRun SetupRm(CLI::App* app, GlobalOptions* globals) {
  auto jobs = std::make_shared<std::vector<std::string>>();
  app->add_option("jobs", *jobs, "job ids")->required();
  return [jobs, globals]() -> int {
    RpcClient client(*globals);
    // Each job on its own: one that cannot be deleted does not keep the others.
    int rc = kExitOk;
    for (const std::string& job : *jobs) {
      Status st = client.DeleteJob(job);
      if (st.ok()) {
        std::cout << job << " deleted\n";
      } else {
        rc = std::max(rc, ReportError(st));
      }
    }
    return rc;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("rm", "Delete finished jobs from the coordinator's state", SetupRm);

}  // namespace drover::cli
