// drover priority JOB P: changes the priority of a job that has not finished: where it waits
// in the queue (higher first, FIFO within one), and which running jobs preemption shrinks
// or stops at their next checkpoints to make room for it, from the next scheduling pass on.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

CommandRun SetupPriority(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string job;
    int priority = 0;
  };
  auto args = std::make_shared<Args>();
  app->add_option("job", args->job, "job id")->required();
  app->add_option("priority", args->priority, "the new priority: higher runs first")->required();
  return [args, globals]() -> int {
    RpcClient client(*globals);
    auto resp = client.SetPriority(args->job, args->priority);
    if (!resp.ok()) return ReportError(resp.status());
    std::cout << args->job << " " << JobStateName(resp->state()) << ", priority " << args->priority;
    if (resp->previous() != args->priority) std::cout << " (was " << resp->previous() << ")";
    std::cout << "\n";
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("priority", "Change a job's priority in the queue and for preemption",
                        SetupPriority);

}  // namespace drover::cli
