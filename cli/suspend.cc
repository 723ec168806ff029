// drover suspend JOB [--reason TEXT] [--now] [--wait [--timeout S]]: stops a job on
// purpose, to be placed again by drover resume: a job waiting for slots at once; a running
// one at the checkpoint its ranks save now, its slots then given back (no restart counted);
// with --now at once, without a new checkpoint (a run that went wrong: it resumes from its
// newest checkpoint). A running job that saves no checkpoints would start again from step
// 0: refused unless --now. With --wait, returns once the job is SUSPENDED: exit 0, or 1
// when it ended otherwise or S passed.
// drover resume JOB: a suspended job waits for slots again and resumes from its newest
// complete checkpoint; a running one asked to suspend trains on.
#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "cli/command.h"
#include "cli/poll.h"
#include "cli/rpc_client.h"
#include "common/job_state.h"

namespace drover::cli {
namespace {

// Polls the job until it is SUSPENDED.
int WaitForSuspended(RpcClient& client, const std::string& job, double timeout_s) {
  v1::JobRecord rec;
  const auto poll = [&]() -> std::optional<int> {
    auto info = client.GetJob(job);
    if (!info.ok()) return ReportError(info.status());
    rec = info->job();
    if (rec.state() == v1::SUSPENDED) {
      const int64_t step = rec.latest_checkpoint_step();
      std::cout << job << " SUSPENDED: after drover resume " << job << " it "
                << (step >= 0 ? "resumes from the checkpoint of step " + std::to_string(step)
                              : std::string("starts from step 0"))
                << "\n";
      return kExitOk;
    }
    if (IsTerminal(rec.state()) || !rec.suspend()) {
      std::cerr << "drover: " << job << " is " << JobStateName(rec.state())
                << (rec.suspend() ? "" : " and no longer asked to suspend")
                << (rec.reason().empty() ? "" : ": " + rec.reason()) << "\n";
      return kExitFailure;
    }
    return std::nullopt;
  };
  return PollUntil(timeout_s, poll, [&] {
    std::cerr << "drover: timed out after " << timeout_s << " s; " << job << " is "
              << JobStateName(rec.state()) << ": " << rec.reason() << "\n";
    return kExitFailure;
  });
}

CommandRun SetupSuspend(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string job;
    std::string reason;
    bool now = false;
    bool wait = false;
    double timeout_s = 0;
  };
  auto args = std::make_shared<Args>();
  app->add_option("job", args->job, "job id")->required();
  app->add_option("--reason", args->reason,
                  "why, shown by drover status until drover resume (\"the Tuesday maintenance\")");
  app->add_flag("--now", args->now,
                "stop a running job at once, without a new checkpoint: it resumes from its "
                "newest one (needed for a job that saves none: it starts again from step 0)");
  app->add_flag("--wait", args->wait, "return once the job is suspended");
  app->add_option("--timeout", args->timeout_s,
                  "with --wait: give up after S seconds (default: never)")
      ->check(CLI::NonNegativeNumber);
  return [args, globals]() -> int {
    RpcClient client(*globals);
    auto resp = client.SuspendJob(args->job, args->reason, args->now);
    if (!resp.ok()) return ReportError(resp.status());
    if (resp->state() == v1::RUNNING) {
      std::cout << args->job << " is suspending: it stops at its checkpoint after step "
                << resp->after_step() << ", asked for now\n";
    } else if (!args->wait) {
      std::cout << args->job << " " << JobStateName(resp->state()) << "; drover resume "
                << args->job << " places it again\n";
    }
    if (!args->wait) return kExitOk;
    return WaitForSuspended(client, args->job, args->timeout_s);
  };
}

CommandRun SetupResume(CLI::App* app, GlobalOptions* globals) {
  auto job = std::make_shared<std::string>();
  app->add_option("job", *job, "job id")->required();
  return [job, globals]() -> int {
    RpcClient client(*globals);
    auto resp = client.ResumeJob(*job);
    if (!resp.ok()) return ReportError(resp.status());
    std::cout << *job << " " << JobStateName(resp->state()) << "\n";
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("suspend",
                        "Stop a job at a checkpoint and give its slots back until drover resume",
                        SetupSuspend);
DROVER_REGISTER_COMMAND("resume", "Place a suspended job again, from its newest checkpoint",
                        SetupResume);

}  // namespace drover::cli
