// drover cancel JOB: stops every trainer of the job; the job ends CANCELLED.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

CommandRun SetupCancel(CLI::App* app, GlobalOptions* globals) {
  auto job = std::make_shared<std::string>();
  app->add_option("job", *job, "job id")->required();
  return [job, globals]() -> int {
    RpcClient client(*globals);
    auto resp = client.CancelJob(*job);
    if (!resp.ok()) return ReportError(resp.status());
    std::cout << *job << " " << JobStateName(resp->state()) << "\n";
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("cancel", "Cancel a job", SetupCancel);

}  // namespace drover::cli
