// drover checkpoint JOB [--wait [--timeout S]]: asks a running job to save a checkpoint at
// the end of the step its ranks are in (before maintenance, a risky change, or a manual
// restart), instead of at its next checkpoint.every_steps. With --wait, returns once that
// checkpoint is complete: exit 0, or 1 when the job stopped running first or S passed.
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "cli/command.h"
#include "cli/poll.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

// Polls the job until a complete checkpoint is of a step after `after`.
int WaitForCheckpoint(RpcClient& client, const std::string& job, int64_t after, double timeout_s) {
  const auto poll = [&]() -> std::optional<int> {
    auto info = client.GetJob(job);
    if (!info.ok()) return ReportError(info.status());
    const v1::JobRecord& rec = info->job();
    if (rec.latest_checkpoint_step() > after) {
      std::string path;
      for (const v1::CheckpointRecord& c : info->checkpoints()) {
        if (c.step() == rec.latest_checkpoint_step()) path = c.path();
      }
      std::cout << job << ": checkpoint of step " << rec.latest_checkpoint_step() << " complete"
                << (path.empty() ? "" : ": " + path) << "\n";
      return kExitOk;
    }
    // A resize or recovery ends the attempt the request was for; the next one does not
    // inherit it.
    if (rec.state() != v1::RUNNING) {
      std::cerr << "drover: " << job << " is " << JobStateName(rec.state())
                << " before the requested checkpoint completed"
                << (rec.reason().empty() ? "" : ": " + rec.reason()) << "\n";
      return kExitFailure;
    }
    return std::nullopt;
  };
  return PollUntil(timeout_s, poll, [&] {
    std::cerr << "drover: timed out after " << timeout_s << " s waiting for a checkpoint of " << job
              << " after step " << after << "\n";
    return kExitFailure;
  });
}

CommandRun SetupCheckpoint(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string job;
    bool wait = false;
    double timeout_s = 0;
  };
  auto args = std::make_shared<Args>();
  app->add_option("job", args->job, "job id")->required();
  app->add_flag("--wait", args->wait, "return once the checkpoint is complete");
  app->add_option("--timeout", args->timeout_s,
                  "with --wait: give up after S seconds (default: never)")
      ->check(CLI::NonNegativeNumber);
  return [args, globals]() -> int {
    RpcClient client(*globals);
    auto resp = client.CheckpointJob(args->job);
    if (!resp.ok()) return ReportError(resp.status());
    std::cout << args->job << ": checkpoint requested; its ranks save it at the end of the step "
              << "they are in (after step " << resp->after_step() << ")\n";
    if (!args->wait) return kExitOk;
    return WaitForCheckpoint(client, args->job, resp->after_step(), args->timeout_s);
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("checkpoint", "Ask a running job to save a checkpoint now",
                        SetupCheckpoint);

}  // namespace drover::cli
