// `drover train JOB.yaml [--set k=v]...`: runs a job in this process, without a
// coordinator (benchmarks, debugging). `--nproc N` is accepted for the interface of
// DESIGN.md, but N > 1 waits for data parallelism.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/engine/threads.h"
#include "worker/engine/trainer.h"
#include "worker/engine/trainer_process.h"

namespace drover::cli {
namespace {

struct TrainFlags {
  std::string spec_path;
  std::vector<std::string> overrides;
  int nproc = 1;
  int threads = 0;  // 0: resources.threads_per_rank
  bool fresh = false;
};

int RunTrain(const TrainFlags& f) {
  if (f.nproc > 1) {
    std::fprintf(stderr,
                 "drover train: --nproc %d: data parallelism is not built yet; "
                 "use --nproc 1\n",
                 f.nproc);
    return kExitUsage;
  }
  auto spec = LoadJobSpecFile(f.spec_path, f.overrides);
  if (!spec.ok()) {
    std::fprintf(stderr, "drover train: %s\n", spec.status().message().c_str());
    return kExitUsage;
  }
  (void)InitLogging("drover train");
  engine::SetNumThreads(f.threads > 0 ? f.threads : spec->resources.threads_per_rank);
  engine::TrainerOptions options;
  options.spec = *spec;
  options.resume = !f.fresh;
  options.stop = engine::InstallStopSignalHandlers();
  auto trainer = engine::Trainer::Create(options);
  if (!trainer.ok()) {
    std::fprintf(stderr, "drover train: %s\n", trainer.status().ToString().c_str());
    return engine::ExitCodeFor(trainer.status());
  }
  Status st = (*trainer)->Run();
  if (!st.ok()) {
    std::fprintf(stderr, "drover train: %s\n", st.ToString().c_str());
    return engine::ExitCodeFor(st) == 0 ? kExitFailure : engine::ExitCodeFor(st);
  }
  return kExitOk;
}

DROVER_REGISTER_COMMAND(
    "train", "Train a job in this process (no coordinator)",
    [](CLI::App* app, GlobalOptions*) -> CommandRun {
      auto flags = std::make_shared<TrainFlags>();
      app->add_option("spec", flags->spec_path, "job spec YAML")->required();
      app->add_option("--set", flags->overrides, "override a key: section.key=value")
          ->allow_extra_args(false);
      app->add_option("--nproc", flags->nproc, "local processes (only 1 for now)")
          ->check(CLI::PositiveNumber);
      app->add_option("--threads", flags->threads,
                      "CPU threads (default resources.threads_per_rank)")
          ->check(CLI::NonNegativeNumber);
      app->add_flag("--fresh", flags->fresh,
                    "ignore existing checkpoints in checkpoint.dir (they are overwritten)");
      return [flags] { return RunTrain(*flags); };
    });

}  // namespace
}  // namespace drover::cli
