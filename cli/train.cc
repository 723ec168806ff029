// `drover train JOB.yaml [--set k=v]... [--nproc N]`: runs a job without a coordinator
// (benchmarks, debugging): in this process, or with N > 1 in N local trainer processes
// (cli/local_launcher.h).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/exit_code.h"
#include "cli/local_launcher.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/engine/kernels/profiled_ops.h"
#include "worker/engine/threads.h"
#include "worker/engine/trainer.h"
#include "worker/engine/trainer_process.h"
#include "worker/gpu_probe.h"

namespace drover::cli {
namespace {

struct TrainFlags {
  std::string spec_path;
  std::vector<std::string> overrides;
  int nproc = 1;
  int threads = 0;  // 0: resources.threads_per_rank
  bool fresh = false;
  bool profile_ops = false;
  std::string trainer;  // hidden --trainer: the rank program for --nproc > 1 (tests)
};

int RunTrain(const TrainFlags& f) {
  if (f.nproc > 1 && f.profile_ops) {
    std::fprintf(stderr,
                 "drover train: --profile-ops profiles the training of one process; run it "
                 "without --nproc\n");
    return kExitUsage;
  }
  std::vector<std::string> overrides = f.overrides;
  // --nproc is the world size; the spec's range is for the coordinator's elastic placement.
  // Set here, the spec validates against it and the ranks read it back.
  if (f.nproc > 1) overrides.push_back("resources.world_size=" + std::to_string(f.nproc));
  auto spec = LoadJobSpecFile(f.spec_path, overrides);
  if (!spec.ok()) {
    std::fprintf(stderr, "drover train: %s\n", spec.status().message().c_str());
    return ExitCodeForInput(spec.status());
  }
  if (f.nproc > 1) {
    return RunLocalLaunch({.spec = *spec,
                           .nproc = f.nproc,
                           .threads = f.threads,
                           .fresh = f.fresh,
                           .trainer_path = f.trainer});
  }
  // First: the signal mask it sets must be inherited by every thread (trainer_process.h).
  const engine::TrainerSignals signals = engine::InstallTrainerSignalHandlers();
  (void)InitLogging("drover train");
  engine::SetNumThreads(f.threads > 0 ? f.threads : spec->resources.threads_per_rank);
  engine::TrainerOptions options;
  options.spec = *spec;
  options.resume = !f.fresh;
  auto peak = PeakTflopsOfThisRank(spec->resources.device);
  if (!peak.ok()) {
    std::fprintf(stderr, "drover train: %s\n", peak.status().ToString().c_str());
    return kExitUsage;
  }
  options.peak_tflops = *peak;
  options.stop = signals.stop;
  options.checkpoint_requests = signals.checkpoint_requests;
  options.drain = signals.drain;
  std::unique_ptr<engine::ProfiledOps> profiled;
  if (f.profile_ops) {
    auto ops = engine::OpsForDevice(spec->resources.device);
    if (!ops.ok()) {
      std::fprintf(stderr, "drover train: %s\n", ops.status().ToString().c_str());
      return engine::ExitCodeFor(ops.status());
    }
    profiled = std::make_unique<engine::ProfiledOps>(*ops);
    options.ops = profiled.get();
  }
  auto trainer = engine::Trainer::Create(options);
  if (!trainer.ok()) {
    std::fprintf(stderr, "drover train: %s\n", trainer.status().ToString().c_str());
    return engine::ExitCodeFor(trainer.status());
  }
  const int64_t first_step = (*trainer)->step();
  Status st = (*trainer)->Run();
  if (profiled != nullptr) {
    // Start-up (initialisation, a resumed checkpoint's load) is in it too, spread over
    // the steps; profile a run of enough steps that it does not matter.
    const int64_t steps = (*trainer)->step() - first_step;
    std::printf("ops profile over %lld steps (%s):\n%s", static_cast<long long>(steps),
                spec->resources.device.c_str(), profiled->Report(steps).c_str());
  }
  if (!st.ok()) {
    std::fprintf(stderr, "drover train: %s\n", st.ToString().c_str());
    if ((*trainer)->drained()) return kExitDrained;
    return engine::ExitCodeFor(st) == 0 ? kExitFailure : engine::ExitCodeFor(st);
  }
  return kExitOk;
}

DROVER_REGISTER_COMMAND(
    "train", "Train a job on this machine, in this process or N local ones (no coordinator)",
    [](CLI::App* app, GlobalOptions*) -> CommandRun {
      auto flags = std::make_shared<TrainFlags>();
      app->add_option("spec", flags->spec_path, "job spec YAML")->required();
      app->add_option("--set", flags->overrides, "override a key: section.key=value")
          ->allow_extra_args(false);
      app->add_option("--nproc", flags->nproc,
                      "local trainer processes (world size); 1 trains in this process")
          ->check(CLI::PositiveNumber);
      app->add_option("--threads", flags->threads,
                      "CPU threads (default resources.threads_per_rank)")
          ->check(CLI::NonNegativeNumber);
      app->add_flag("--fresh", flags->fresh,
                    "ignore existing checkpoints in checkpoint.dir (they are overwritten)");
      app->add_flag("--profile-ops", flags->profile_ops,
                    "time every kernel-table op (synchronising after each) and print where "
                    "the steps' time went, op by op");
      app->add_option("--trainer", flags->trainer)->group("");  // tests: a scripted trainer
      return [flags] { return RunTrain(*flags); };
    });

}  // namespace
}  // namespace drover::cli
