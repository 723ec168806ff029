// drover wait JOB [--timeout S]: blocks until the job ends; exit 0 only on SUCCEEDED.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <thread>

#include "cli/command.h"
#include "cli/rpc_client.h"
#include "common/job_state.h"

namespace drover::cli {
namespace {

CommandRun SetupWait(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string job;
    double timeout_s = 0;
  };
  auto args = std::make_shared<Args>();
  app->add_option("job", args->job, "job id")->required();
  app->add_option("--timeout", args->timeout_s, "give up after S seconds (default: never)")
      ->check(CLI::NonNegativeNumber);
  return [args, globals]() -> int {
    using Clock = std::chrono::steady_clock;
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(args->timeout_s * 1000));
    // Retrying an unreachable coordinator never outlasts --timeout.
    GlobalOptions retry = *globals;
    if (args->timeout_s > 0) retry.retry_for_s = std::min(retry.retry_for_s, args->timeout_s);
    RpcClient client(retry);
    // A coordinator restart during a long wait is survivable: keep polling until the
    // deadline; only a coordinator that never answered is an error at once.
    bool ever_reached = false;
    bool told_suspended = false;
    for (;;) {
      auto info = client.GetJob(args->job);
      if (info.ok()) {
        ever_reached = true;
        v1::JobState state = info->job().state();
        if (IsTerminal(state)) {
          std::cout << args->job << " " << JobStateName(state)
                    << (info->job().reason().empty() ? "" : ": " + info->job().reason()) << "\n";
          return state == v1::SUCCEEDED ? kExitOk : kExitFailure;
        }
        // Not an end: said once, on stderr, and the wait goes on.
        if (state == v1::SUSPENDED && !told_suspended) {
          std::cerr << "drover: " << args->job << " is SUSPENDED: " << info->job().reason()
                    << "; still waiting\n";
        }
        told_suspended = state == v1::SUSPENDED;
      } else if (!ever_reached || info.status().code() != StatusCode::kUnavailable) {
        return ReportError(info.status());
      } else {
        client = RpcClient(retry);  // dial a restarted coordinator afresh
      }
      if (args->timeout_s > 0 && Clock::now() >= deadline) {
        std::cerr << "drover: timed out after " << args->timeout_s << " s waiting for " << args->job
                  << "\n";
        return kExitFailure;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("wait", "Wait for a job to end (exit 0 only when it succeeded)", SetupWait);

}  // namespace drover::cli
