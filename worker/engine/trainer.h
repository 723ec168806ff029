// The training loop of one rank, used by `drover train` and by the drover-trainer
// executable that the worker agent (or `drover train --nproc N`) launches.
//
// A Trainer validates the parallel layout for its world size (ParallelMesh), connects the
// rank's process groups through the bootstrap store, and owns its part of the model
// (parallel::ParallelGpt: from the job spec, train.init_from, or the newest valid
// checkpoint in checkpoint.dir), the train DataLoader (this rank's dp slice of every
// global batch) and the validation loader. One optimizer step is the mesh's micro-batches
// of forward and backward (pipelined when pp > 1), the dp reduction, global-norm clipping,
// then AdamW with the scheduled LR. With world size 1 it is single-process training.
//
// Side effects, all under the job's output_dir / checkpoint.dir, written by world rank 0
// only: one JSON line per step in <output_dir>/metrics.jsonl, checkpoints every
// checkpoint.every_steps (gathered to rank 0, written asynchronously when
// checkpoint.async), the final model as the llm.c model file <output_dir>/model.bin.
// Progress goes to the TrainerListener on every rank, complete checkpoints on rank 0.
//
// Thread-safety: a Trainer is driven by one thread. `stop` may be set from any thread (or
// a signal handler); the loop checks it between micro-batches and abandons the step.
// `checkpoint_requests` may grow on any thread; the loop reads it once a step.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/job_spec.h"
#include "common/mutex.h"
#include "common/parallel_mesh.h"
#include "common/status.h"
#include "worker/engine/ckpt/async_writer.h"
#include "worker/engine/data/loader.h"
#include "worker/engine/eval/choice_batches.h"
#include "worker/engine/metrics.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/parallel/kv_store.h"
#include "worker/engine/parallel/parallel_gpt.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/publish_fence.h"
#include "worker/engine/spike_detector.h"

namespace drover::engine {

// Where progress goes besides the log and metrics.jsonl: drover-trainer forwards these to
// the worker agent (worker/trainer_reporter.h). Called on the training thread, except
// OnCheckpoint and OnCheckpointFailed, which run on the checkpoint writer thread, and OnWork
// (see there).
class TrainerListener {
 public:
  virtual ~TrainerListener() = default;
  virtual void OnStep(const StepMetrics& metrics) = 0;
  // A checkpoint directory became complete.
  virtual void OnCheckpoint(const v1::CheckpointRecord& record) = 0;
  // Writing the checkpoint of `step` failed (training goes on; the next one is tried at its
  // interval). On the checkpoint writer thread, like OnCheckpoint.
  virtual void OnCheckpointFailed(int64_t /*step*/, const Status& /*error*/) {}
  // A loss spike at `spike_step` was rolled back to checkpoint `to_step`; `rollbacks` so far.
  virtual void OnRollback(int64_t /*spike_step*/, int64_t /*to_step*/, int64_t /*rollbacks*/) {}
  // Start-up found ranks cut off from their peers (parallel/peer_check.h); Create fails next.
  virtual void OnPeersCutOff(const std::vector<int>& /*ranks*/) {}
  // Work between two steps, or before the first, goes on ("evaluating data.hellaswag: batch
  // 120 of 1255", "restoring checkpoint ...: 512.0 of 4096.0 MB read", "saving checkpoint step
  // 400: ..."): called as an evaluation, a checkpoint's read or this rank's write of one starts
  // and then at most every kWorkReportSeconds, so that a long one is not taken for a hang
  // (TrainerProgress.work). From the training thread, a read's threads or the checkpoint
  // writer thread, one call at a time.
  virtual void OnWork(const std::string& /*what*/) {}
  // Training finished; the final model is written.
  virtual void OnDone() = 0;
};

struct TrainerOptions {
  JobSpec spec;
  std::string job_id;  // recorded in checkpoints and reports ("" outside a cluster)
  int64_t attempt = 0;
  int rank = 0;
  int world_size = 1;
  // Bootstrap of the process groups (required when world_size > 1; not owned): keys of
  // this job attempt only (the coordinator's rendezvous, or drover train's local store).
  parallel::KvStore* store = nullptr;
  std::string bind_address = "127.0.0.1";  // where this rank accepts its peers
  // How long start-up waits for every rank to show up (ranks start at different times).
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};
  // How long rank 0 waits for the other ranks' checkpoint shards to become durable before
  // it gives that checkpoint up (training is not held up meanwhile).
  std::chrono::milliseconds checkpoint_collect_timeout{std::chrono::minutes(10)};
  // A checkpoint falls due while a rank's previous one has been in flight this long
  // (waiting on the coordinator, a peer's report or a slow disk): every rank defers it to
  // the first step at which none is that late, rather than wait for it in the training
  // thread, where a wait past parallel.timeout_s would fail the attempt. A previous save in
  // flight for less is waited for, as a save that keeps pace with the interval always is,
  // so a healthy run checkpoints exactly every checkpoint.every_steps; one waiting on a
  // coordinator it cannot reach is deferred for, or given up for, at once
  // (AsyncCheckpointWriter::WaitingOnCoordinator).
  std::chrono::milliseconds checkpoint_defer_after{std::chrono::seconds(1)};
  bool resume = true;     // continue from the newest valid checkpoint in checkpoint.dir
  int prefetch = 2;       // micro-batches the loader assembles ahead
  bool log_steps = true;  // one log line per train.log_every steps
  TrainerListener* listener = nullptr;      // not owned; nullptr = no reports
  const std::atomic<bool>* stop = nullptr;  // not owned; set = stop promptly
  // Checkpoint requests so far (SIGUSR1: trainer_process.h), read by the training thread.
  // When it has grown, this rank votes in its next step's all-reduce, and every rank saves
  // a checkpoint at the end of the first step any rank voted in, so they agree on the step
  // without a collective of their own. Ignored (with a warning) when the job saves no
  // checkpoints (checkpoint.every_steps and every_minutes 0). Not owned; nullptr = never.
  const std::atomic<uint64_t>* checkpoint_requests = nullptr;
  // Drain (SIGUSR2, set after its checkpoint request was counted): the checkpoint every rank
  // agrees on for that request is saved, this rank waits until it is committed (rank 0
  // commits it; another rank waits for step_N/ to appear, up to
  // checkpoint_collect_timeout), and Run returns Cancelled saying so. The job's next attempt
  // then resumes from that checkpoint, losing no training. Without checkpoints
  // (checkpoint.every_steps and every_minutes 0) it stops after the step in progress. Not
  // owned; nullptr = never.
  const std::atomic<bool>* drain = nullptr;
  // Under a coordinator: metrics lines, checkpoint commits and the model file are written
  // only while this attempt's lease is current (publish_fence.h). Not owned; nullptr = always.
  PublishFence* fence = nullptr;
  // The dense 16-bit peak of this rank's device, TFLOP/s (worker/gpu_probe.h's
  // PeakTflopsOfThisRank), every rank's the same: the steps' metrics then carry their MFU.
  // 0: unknown, no MFU.
  double peak_tflops = 0;
  // The kernel table, when not the one resources.device names (tests run the engine on an
  // emulated device memory through it). Not owned; nullptr = by resources.device.
  Ops* ops = nullptr;
  // What checkpoint.every_minutes is measured by. Not owned; nullptr = SystemClock.
  const Clock* clock = nullptr;
};

// The kernel table resources.device names: CpuOps for "cpu", the CUDA plugin's for
// "cuda". InvalidArgument for another name; FailedPrecondition when CUDA cannot load.
StatusOr<Ops*> OpsForDevice(const std::string& device);

// The checkpoint directory the spec names: checkpoint.dir, else <output_dir>/ckpt.
std::string CheckpointDirOf(const JobSpec& spec);
// The output directory: output_dir, else runs/<name>.
std::string OutputDirOf(const JobSpec& spec);

class Trainer {
 public:
  // Validates the spec and the parallel layout for this world size, connects the process
  // groups, opens the data (checking every token id against the vocabulary), builds or
  // restores the model and optimizer. InvalidArgument for a bad spec, layout or data,
  // NotFound for missing files, DeadlineExceeded when peers do not show up.
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);
  ~Trainer();

  // Trains from step() to train.steps, evaluating, checkpointing and logging as the spec
  // says, then writes the final checkpoint (when checkpoints are enabled) and model.bin and
  // reports Done. Cancelled when `stop` was set (the step in progress is abandoned; the
  // checkpoint in flight, if any, is completed first).
  Status Run();

  // One optimizer step (no eval, checkpoint or model file). Cancelled when stopped.
  StatusOr<StepMetrics> Step();

  // Mean validation loss over the first min(eval_batches, available) batches of
  // (micro_batch, seq_len), or NotFound when there is no validation data. Collective.
  StatusOr<double> Evaluate();
  // data.hellaswag's examples scored through the same passes, on every rank: their accuracy,
  // and each ending's summed loss in hellaswag_losses() (every example's endings in order).
  // FailedPrecondition when the job has no data.hellaswag (or train.eval_every is 0).
  // Collective.
  StatusOr<ChoiceAccuracy> EvaluateHellaswag();
  const std::vector<double>& hellaswag_losses() const;

  // How often, at most, an evaluation or a checkpoint's read tells the listener it goes on
  // (TrainerListener::OnWork).
  static constexpr double kWorkReportSeconds = 1.0;

  // Gathers the state to rank 0, which writes checkpoint step_<step()> (in the background
  // when `async`; Flush waits for it). Collective: its error is a collective's (a peer gone);
  // a failed write is logged and reported to the listener, and the next interval retries.
  Status SaveCheckpoint(bool async);
  // SaveCheckpoint(checkpoint.async) for the checkpoint due at this step, unless the step's
  // all-reduce said a rank's previous one is late (checkpoint_defer_after): then the next
  // step tries again.
  Status SaveOrDeferCheckpoint();
  Status FlushCheckpoints();

  // Writes the model as an llm.c model file (rank 0). Collective.
  Status SaveModel(const std::string& path);

  // The global parameter arena, assembled on rank 0 (empty elsewhere). Collective.
  StatusOr<std::vector<float>> GlobalParams();

  int64_t step() const { return step_; }                  // optimizer steps completed
  int64_t resumed_from() const { return resumed_from_; }  // checkpoint step, -1 if none
  // Run returned for a drain (TrainerOptions::drain), after its checkpoint was committed or
  // when the job keeps none; or because a drained peer left (its collective failed).
  bool drained() const { return drained_; }
  const GptConfig& model_config() const { return config_; }
  int64_t optimizer_steps() const { return model_->optimizer_steps(); }
  const JobSpec& spec() const { return options_.spec; }
  const ParallelMesh& mesh() const { return *mesh_; }
  int accum_steps() const { return mesh_->micro_batches(); }

 private:
  explicit Trainer(const TrainerOptions& options);
  Status Init();
  // Connects groups_ (world_size > 1): NCCL or Gloo (parallel/cuda_groups.h), chosen alike on
  // every rank.
  // Whether every rank reaches every other (parallel/peer_check.h): Unavailable naming the
  // ranks cut off when not, after telling the listener.
  Status CheckPeers();
  Status ConnectGroups(Ops* ops);
  // Logs parallel.pp_layers that would balance the pipeline (BalancedStageLayers) when the
  // even split does not.
  void SuggestStageLayers() const;
  // The global parameters to start from: train.init_from, else the seeded init.
  StatusOr<std::vector<float>> InitialParams();
  Status OpenData();
  // Tells the listener that work goes on, as describe() says: when it starts (`first`), then
  // at most every kWorkReportSeconds. Thread-safe; the listener is called one call at a time.
  void ReportWork(bool first, const std::function<std::string()>& describe) EXCLUDES(work_mu_);
  // Loads the newest usable checkpoint on every rank (rank 0 chooses, published under the
  // store key `choice_key`: a new key for each restore of one attempt).
  Status RestoreLatest(const std::string& choice_key = "resume-step");
  // After a loss spike at step_ (`m`): back to the newest checkpoint, data skipped through
  // the spike and skip_steps more global batches. Collective (every rank sees the same loss).
  Status RollBack(const StepMetrics& m);
  // Rank 0: appends `m` to metrics.jsonl (with any held lines first) when the fence allows;
  // holds it otherwise. With `wait`, confirms the attempt first (the run's end).
  Status PublishMetrics(const StepMetrics* m, bool wait);
  // Waits (up to the connect timeout) until every rank reached `name`: a barrier through
  // the bootstrap store for phases longer than the communicators' deadline.
  Status StoreBarrier(const std::string& name);
  bool StopRequested() const;
  bool DrainRequested() const;
  // After the drain's checkpoint of this step: waits until it is committed, then says so in
  // the store (kDrainedKey); Cancelled.
  Status FinishDrain();
  // `failed` (a step's error), or Cancelled when a peer was drained (kDrainedKey): its exit
  // failed this rank's collective, and this rank counts as drained too.
  Status PeerDrained(const Status& failed);
  static constexpr char kDrainedKey[] = "drained";
  int64_t Now() const;  // options_.clock's NowMs()
  // Whether the step just taken should end with a checkpoint because one was requested
  // (TrainerOptions::checkpoint_requests); marks the votes behind it served.
  bool TakeCheckpointRequest();
  bool is_rank0() const { return options_.rank == 0; }
  void LogStep(const StepMetrics& m) const;
  // The snapshot of checkpoint step_ from gathered global arenas (rank 0).
  // This rank's shard of a checkpoint at step_, with the manifest fields.
  ckpt::ShardSnapshot MakeSnapshot();
  void OnCheckpointComplete(const v1::CheckpointManifest& meta, const std::string& path);

  TrainerOptions options_;
  Ops* ops_ = nullptr;  // the kernel table of resources.device (or options.ops)
  std::optional<ParallelMesh> mesh_;
  GptConfig config_;
  std::string output_dir_;
  std::string ckpt_dir_;
  int B_ = 0;
  int T_ = 0;
  parallel::ProcessGroups groups_;
  std::unique_ptr<parallel::ParallelGpt> model_;
  std::shared_ptr<const TokenDataset> train_data_;
  std::shared_ptr<const TokenDataset> val_data_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<EvalLoader> val_loader_;
  std::unique_ptr<ChoiceBatches> hellaswag_;         // data.hellaswag, with evaluation on
  std::unique_ptr<ckpt::KvShardExchange> exchange_;  // world size > 1
  std::unique_ptr<SpikeDetector> spike_;             // fault_tolerance.spike_rollback.enabled
  int64_t rollbacks_ = 0;
  std::deque<StepMetrics> held_metrics_;  // rank 0: lines waiting for the fence
  int64_t dropped_metrics_ = 0;           // held lines dropped past the cap
  std::unique_ptr<ckpt::AsyncCheckpointWriter> writer_;
  MetricsWriter metrics_;  // open on rank 0 only
  int64_t step_ = 0;
  int64_t resumed_from_ = -1;
  int64_t last_checkpoint_step_ = -1;
  // checkpoint_requests as this rank last voted on it, and as of its last served request;
  // whether the last step's all-reduce carried a vote (any rank's).
  uint64_t requests_voted_ = 0;
  uint64_t requests_served_ = 0;
  bool checkpoint_voted_ = false;
  // Whether the last step's all-reduce said some rank's previous checkpoint is late
  // (checkpoint_defer_after), and the step of the checkpoint deferred for it (-1: none).
  bool checkpoint_busy_ = false;
  int64_t checkpoint_deferred_since_ = -1;
  bool warned_no_checkpoints_ = false;
  // clock NowMs() of the last checkpoint this rank took (or of its start), and whether this
  // rank voted in the last step because checkpoint.every_minutes had passed since.
  int64_t last_checkpoint_ms_ = 0;
  bool time_voted_ = false;
  double time_voted_minutes_ = 0;  // the time since the last checkpoint at that vote
  // A drain was seen before this rank voted: the next checkpoint saved ends the run.
  bool drain_voted_ = false;
  bool drained_ = false;  // Run ended for a drain, its checkpoint committed (or none kept)
  // When the last step ended, and WaitSeconds(groups_) then: busy_ms spans from there to the
  // next step's end, so what a rank does between steps (evaluation, checkpoint snapshots,
  // its listener) counts too. Unset before the first step.
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;
  // When the listener was last told that work goes on (ReportWork, from the training thread
  // and the checkpoint writer's).
  Mutex work_mu_;
  std::chrono::steady_clock::time_point last_work_report_ GUARDED_BY(work_mu_);
  double last_step_waited_s_ = 0;
};

}  // namespace drover::engine
