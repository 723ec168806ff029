// drover submit JOB.yaml [--set k=v]... [--priority P] [--after JOB]... [--time-limit D]:
// validates locally, prints the job id. With --after, the job is placed only once each job
// named has SUCCEEDED; --time-limit sets resources.time_limit_minutes (both:
// coordinator/job_manager.h).
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "cli/rpc_client.h"
#include "common/duration.h"
#include "common/job_spec.h"
#include "common/yaml_util.h"

namespace drover::cli {
namespace {

CommandRun SetupSubmit(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string path;
    std::vector<std::string> sets;
    int priority = 0;
    std::vector<std::string> after;
    std::string time_limit;
  };
  auto args = std::make_shared<Args>();
  app->add_option("spec", args->path, "job spec YAML")->required();
  app->add_option("--set", args->sets, "override section.key=value (repeatable)");
  app->add_option("--priority", args->priority, "higher runs first (default 0)");
  app->add_option("--after", args->after,
                  "start only once this job has succeeded (repeatable, or JOB,JOB): until "
                  "then it waits, holding back no other job; if that job fails or is "
                  "cancelled it never starts")
      ->delimiter(',');
  app->add_option("--time-limit", args->time_limit,
                  "the most it may run, over all its attempts (30m, 12h, 7d; after any "
                  "--set): at the limit it stops at a checkpoint saved then, and ends FAILED; "
                  "a job with a limit may start before one that waits for slots (backfill)");
  return [args, globals]() -> int {
    // A spec that cannot be read is bad input (exit 2) whatever the reason.
    StatusOr<std::string> text = ReadJobSpecFile(args->path);
    if (!text.ok()) return ReportError(InvalidArgumentError(text.status().message()));
    // The coordinator stores the spec with overrides applied, so every rank of every
    // attempt sees the same thing; validate here so a typo fails before it is queued.
    std::vector<std::string> sets = args->sets;
    if (!args->time_limit.empty()) {
      StatusOr<int64_t> ms = ParseDurationMs(args->time_limit, "--time-limit");
      if (!ms.ok()) return ReportError(ms.status());
      if (*ms == 0) {
        return ReportError(InvalidArgumentError(
            "--time-limit 0 would stop the job before it starts; leave it out for no limit"));
      }
      sets.push_back("resources.time_limit_minutes=" +
                     yaml_util::FormatDouble(static_cast<double>(*ms) / 60'000.0));
    }
    StatusOr<std::string> yaml = ApplyOverrides(*text, sets);
    if (!yaml.ok()) return ReportError(InvalidArgumentError(yaml.status().message()));
    StatusOr<JobSpec> spec = ParseJobSpec(*yaml, {}, args->path);
    if (!spec.ok()) return ReportError(InvalidArgumentError(spec.status().message()));
    RpcClient client(*globals);
    StatusOr<std::string> id = client.SubmitJob(*yaml, args->priority, args->after);
    // A job to run after that does not exist is input to fix, as a bad spec is (exit 2).
    if (!id.ok() && id.status().code() == StatusCode::kNotFound) {
      return ReportError(InvalidArgumentError(id.status().message()));
    }
    if (!id.ok()) return ReportError(id.status());
    std::cout << *id << "\n";
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("submit", "Submit a job spec; prints the job id", SetupSubmit);

}  // namespace drover::cli
