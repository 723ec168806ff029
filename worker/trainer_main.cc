// drover-trainer: one rank of a job, launched by the worker agent with the environment of
// worker/trainer_env.h. Reads the effective job spec from DROVER_SPEC, resumes from the
// newest valid checkpoint in checkpoint.dir unless DROVER_FRESH=1 (DROVER_RESUME_CHECKPOINT
// is only a hint: the directory is the truth, since a newer checkpoint may have completed
// after the coordinator chose), trains, and reports through DROVER_STATUS_FD. Exit: 0 finished, 1
// runtime failure or stopped by SIGTERM, 2 invalid spec, data or environment, 3 its GPU
// failed or cannot be used (common/exit_codes.h).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "common/exit_codes.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "worker/attempt_lease.h"
#include "worker/engine/kernels/cuda_backend.h"
#include "worker/engine/threads.h"
#include "worker/engine/trainer.h"
#include "worker/engine/trainer_process.h"
#include "worker/gpu_probe.h"
#include "worker/rendezvous_kv_store.h"
#include "worker/trainer_env.h"
#include "worker/trainer_reporter.h"

namespace {

// Forwards the trainer's events to the agent over DROVER_STATUS_FD.
class ReporterListener final : public drover::engine::TrainerListener {
 public:
  explicit ReporterListener(drover::TrainerReporter* reporter) : reporter_(reporter) {}
  void OnStep(const drover::engine::StepMetrics& m) override {
    reporter_->Progress(m.step, m.step_ms, m.loss, m.tokens_per_s,
                        {.lr = m.lr,
                         .val_loss = m.val_loss,
                         .hellaswag = m.hellaswag,
                         .mfu = m.mfu.value_or(0),
                         .busy_ms = m.busy_ms,
                         .pp_stage = m.pp_stage});
  }
  void OnCheckpoint(const drover::v1::CheckpointRecord& record) override {
    reporter_->Checkpoint(record);
  }
  void OnCheckpointFailed(int64_t step, const drover::Status& error) override {
    reporter_->CheckpointFailed("step " + std::to_string(step) + ": " + error.ToString());
  }
  void OnRollback(int64_t spike_step, int64_t to_step, int64_t rollbacks) override {
    reporter_->RolledBack(spike_step, to_step, rollbacks);
  }
  void OnPeersCutOff(const std::vector<int>& ranks) override { reporter_->CutOff(ranks); }
  void OnWork(const std::string& what) override { reporter_->Working(what); }
  void OnDone() override { reporter_->Done(); }

 private:
  drover::TrainerReporter* reporter_;
};

int Fail(const drover::Status& st, const char* what) {
  spdlog::error("{}: {}", what, st.ToString());
  return drover::engine::ExitCodeFor(st);
}

}  // namespace

int main(int, char**) {
  using namespace drover;
  const engine::TrainerSignals signals = engine::InstallTrainerSignalHandlers();
  (void)InitLogging("drover-trainer");
  auto env = ReadTrainerEnv();
  if (!env.ok()) return Fail(env.status(), "trainer environment");
  if (env->spec_path.empty()) {
    std::fprintf(stderr,
                 "drover-trainer: %s is not set; this program is started by "
                 "drover-worker (use `drover train JOB.yaml` to train by hand)\n",
                 kEnvSpecPath);
    return 2;
  }
  auto spec = LoadJobSpecFile(env->spec_path);
  if (!spec.ok()) return Fail(spec.status(), "job spec");
  const bool threads_from_env = std::getenv(kEnvThreads) != nullptr;
  engine::SetNumThreads(threads_from_env ? env->threads : spec->resources.threads_per_rank);

  TrainerReporter reporter = TrainerReporter::FromEnv();
  reporter.Phase("loading");
  engine::TrainerOptions options;
  options.spec = *spec;
  options.job_id = env->job_id;
  options.attempt = env->attempt;
  options.rank = env->rank;
  options.world_size = env->world_size;
  options.resume = !env->fresh;
  auto peak = PeakTflopsOfThisRank(spec->resources.device, env->ranks_on_gpu);
  if (!peak.ok()) return Fail(peak.status(), "trainer environment");
  options.peak_tflops = *peak;
  options.bind_address = env->bind_address;
  // The ranks of a job find each other through the coordinator's rendezvous service (or the
  // one `drover train --nproc` serves), in the keys of this attempt.
  // The agent's cluster certificate when it dials the coordinator with TLS.
  auto tls = LoadTlsCredentials(env->tls, CertNeed::kRequired);
  if (!tls.ok()) return Fail(tls.status(), "trainer environment (DROVER_TLS_*)");
  std::unique_ptr<RendezvousClient> rendezvous;
  std::unique_ptr<RendezvousKvStore> store;
  if (env->world_size > 1) {
    if (env->coordinator.empty()) {
      return Fail(InvalidArgumentError(std::string(kEnvCoordinator) +
                                       " is not set; a job of several ranks needs a rendezvous"),
                  "trainer environment");
    }
    rendezvous = std::make_unique<RendezvousClient>(env->coordinator, env->job_id, env->attempt,
                                                    /*rpc_timeout_ms=*/10000, *tls);
    store = std::make_unique<RendezvousKvStore>(rendezvous.get());
    options.store = store.get();
  }
  // Under an agent: publish (metrics, checkpoints, the model) only while the coordinator
  // confirms that this attempt is the job's current one. A superseded attempt stops.
  std::unique_ptr<RendezvousClient> lease_client;
  std::unique_ptr<AttemptLease> lease;
  if (env->lease_ms > 0 && !env->coordinator.empty()) {
    lease_client =
        std::make_unique<RendezvousClient>(env->coordinator, env->job_id, env->attempt,
                                           std::max<int64_t>(env->lease_ms / 2, 100), *tls);
    lease = std::make_unique<AttemptLease>(lease_client.get(), env->lease_ms,
                                           [](const Status&) { ::kill(::getpid(), SIGTERM); });
    options.fence = lease.get();
  }
  ReporterListener listener(&reporter);
  options.listener = &listener;
  options.stop = signals.stop;
  options.checkpoint_requests = signals.checkpoint_requests;
  options.drain = signals.drain;
  spdlog::info("drover-trainer job={} attempt={} rank={}/{} pid {} threads={} resume hint='{}'",
               env->job_id, env->attempt, env->rank, env->world_size, getpid(),
               engine::NumThreads(), env->resume_checkpoint);
  auto trainer = engine::Trainer::Create(options);
  if (!trainer.ok()) {
    const int code = Fail(trainer.status(), "trainer start-up");
    // This slot's GPU, not the job, is at fault: the coordinator cordons it.
    return engine::CudaDeviceFailed() ? kExitDeviceFault : code;
  }
  if (!env->fresh && !env->resume_checkpoint.empty() && (*trainer)->resumed_from() < 0) {
    // The coordinator recorded a complete checkpoint and the directory now holds none:
    // starting from scratch would silently throw the job's progress away.
    return Fail(
        FailedPreconditionError("the coordinator recorded checkpoint " + env->resume_checkpoint +
                                ", but " + engine::CheckpointDirOf(*spec) +
                                " holds no checkpoint (removed?); resubmit the job to "
                                "start from scratch"),
        "trainer start-up");
  }
  reporter.Phase("training");
  Status st = (*trainer)->Run();
  if ((*trainer)->drained()) {
    spdlog::warn("{}", st.message());  // the exit's last line, which the coordinator shows
    return kExitDrained;
  }
  if (st.code() == StatusCode::kCancelled) {
    spdlog::warn("stopped by signal at step {}", (*trainer)->step());
    return 1;
  }
  if (!st.ok()) return Fail(st, "training");
  return 0;
}
