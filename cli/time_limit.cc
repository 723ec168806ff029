// drover time-limit JOB D: changes the time limit of a job that has not finished (its
// spec's resources.time_limit_minutes; 0 lifts it): it may run until its attempts have run
// that long, and then stops at a checkpoint (coordinator/job_manager.h, "Time limits").
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "cli/command.h"
#include "cli/rpc_client.h"
#include "common/duration.h"

namespace drover::cli {
namespace {

CommandRun SetupTimeLimit(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string job;
    std::string limit;
  };
  auto args = std::make_shared<Args>();
  app->add_option("job", args->job, "job id")->required();
  app->add_option("limit", args->limit,
                  "the most it may run over all its attempts (30m, 12h, 7d); 0: no limit")
      ->required();
  return [args, globals]() -> int {
    StatusOr<int64_t> ms = ParseDurationMs(args->limit, "drover time-limit");
    if (!ms.ok()) return ReportError(ms.status());
    const double minutes = static_cast<double>(*ms) / 60'000.0;
    RpcClient client(*globals);
    auto resp = client.SetTimeLimit(args->job, minutes);
    if (!resp.ok()) return ReportError(resp.status());
    // "j-1 RUNNING, time limit 24h00m (was 12h00m), 11h58m used"
    std::cout << args->job << " " << JobStateName(resp->state()) << ", time limit "
              << FormatTimeLimit(minutes);
    if (resp->previous_minutes() != minutes) {
      std::cout << " (was " << FormatTimeLimit(resp->previous_minutes()) << ")";
    }
    std::cout << ", " << FormatDurationMs(resp->ran_ms()) << " used\n";
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("time-limit", "Change how long a job may run over all its attempts",
                        SetupTimeLimit);

}  // namespace drover::cli
