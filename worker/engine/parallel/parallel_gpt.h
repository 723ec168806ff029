// ParallelGpt: one rank's part of a GPT trained on a device mesh, and its optimizer step.
//
// The techniques of parallel/ are applied by Create in this order (torchtitan's
// parallelize), each by its own piece:
//   1. tensor parallelism  - the layout cuts every tensor to this rank's tp part, and the
//                            stage all-reduces inside each block over the tp group
//                            (GptLayout, GptStage);
//   2. pipeline parallelism - the layout keeps this stage's layers (one GptStage per model
//                            chunk under the interleaved schedule); a step runs the
//                            stage's schedule, sending activations and their gradients to
//                            the neighbouring (virtual) stages (pipeline.h); the tied
//                            embedding's gradient is summed between first and last stage;
//   3. data parallelism / ZeRO - the TrainingMemory reduces (and shards) over the dp group
//                            (data_parallel.h, zero_sharded.h);
//   4. the optimizer       - AdamW over the shard this rank owns, clipped by the global
//                            gradient norm (summed over the world).
// Mixed precision (options.precision) sits beside them: the stage reads narrowed copies of
// the fp32 master weights (NarrowedParams) and stores narrowed activations; under fp16 the
// loss is scaled before backward and a step whose gradients overflowed anywhere in the world
// is skipped on every rank (DynamicLossScaler). Reductions, the norm, the clip and AdamW
// stay fp32.
// With world size 1 every group is null and the step is single-process training, bit for
// bit: one stage, plain gradient accumulation, no communication.
//
// The trainer calls Step and Evaluate; it does not know which techniques are on. Global
// values (loss, gradient norm, validation loss) are the same on every rank.
//
// Thread-safety: driven by one thread (the training thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/parallel_mesh.h"
#include "common/status.h"
#include "worker/engine/kernels/host_floats.h"
#include "worker/engine/kernels/ops.h"
#include "worker/engine/model/global_part.h"
#include "worker/engine/model/gpt_layout.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/narrowed_params.h"
#include "worker/engine/optim/adamw.h"
#include "worker/engine/optim/loss_scaler.h"
#include "worker/engine/parallel/pipeline.h"
#include "worker/engine/parallel/process_groups.h"
#include "worker/engine/parallel/training_memory.h"

namespace drover::engine::parallel {

struct ParallelGptOptions {
  GptConfig config;
  int rank = 0;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int micro_batch = 1;  // B
  int seq_len = 1;      // T
  AdamWConfig adam;
  double grad_clip = 1.0;                   // 0 disables clipping
  size_t bucket_floats = size_t{25} << 18;  // 25 MiB of fp32
  Precision precision = Precision::kFp32;
  LossScalerConfig loss_scaler;  // fp16 only
  // Layers of each model chunk whose activations backward recomputes (the chunk's first
  // ones; negative: all): StageActivations' `recompute`.
  int recompute = 0;
};

struct StepResult {
  double loss = 0;       // mean training loss over the global batch
  double grad_norm = 0;  // global, before clipping (unscaled; inf when it overflowed)
  // fp16: the loss scale this step's backward ran with, and whether its gradients
  // overflowed so that the optimizer step was skipped (on every rank). 1 / false otherwise.
  double loss_scale = 1;
  bool skipped = false;
  // dp communication during forward and backward (gradient reduction, ZeRO-3's gathers):
  // time on the comm stream, and how much of it the training thread waited for.
  double comm_busy_s = 0;
  double comm_blocked_s = 0;
  // What of comm_blocked_s the rank's groups left out of their wait_seconds() (calls beside
  // its compute, communicator.h's OverlappedCalls): part of its wait for its peers.
  double comm_overlapped_waits_s = 0;
  double publish_s = 0;  // the all-gather of updated parameters after the optimizer (ZeRO-1/2)
  // Time blocked on transfers with neighbouring stages (receives, and sends still running
  // when waited for), as the groups count it (on a GPU from the rank's own kernels before the
  // transfer having finished: Communicator::wait_seconds).
  double pp_wait_s = 0;
  // Bytes this rank holds for parameters, gradients, AdamW state and ZeRO's transient
  // buffers (most at once so far).
  size_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, working_bytes = 0;
  // Bytes of every activation set this rank keeps (one per micro-batch a chunk holds in
  // flight), what train.recompute trades against time.
  size_t activation_bytes = 0;
  bool checkpoint_voted = false;  // some rank voted for a checkpoint at this step (Step)
  bool checkpoint_busy = false;   // some rank is still saving an earlier checkpoint (Step)
};

// What each rank says in a step's all-reduce, for every rank to read in its StepResult.
struct StepVotes {
  bool checkpoint = false;       // asks for a checkpoint (StepResult::checkpoint_voted)
  bool checkpoint_busy = false;  // still saving an earlier one (StepResult::checkpoint_busy)
};

class ParallelGpt {
 public:
  // Fills (B, T) inputs and targets with this rank's next training micro-batch; an error
  // (a stop request) abandons the step.
  using BatchFn = std::function<Status(int32_t* inputs, int32_t* targets)>;
  // Fills B * T inputs and targets with validation batch i: (B, T), or rows of Evaluate's
  // row_length.
  using EvalBatchFn = std::function<Status(int64_t i, int32_t* inputs, int32_t* targets)>;
  // Each position's loss of validation batch i, B * T host floats laid out as the batch, on
  // the ranks that compute them: the last pipeline stage's, tensor-parallel rank 0.
  using EvalLossesFn = std::function<void(int64_t i, const float* losses)>;

  // `groups` must hold the communicators of `mesh` for options.rank (ConnectProcessGroups);
  // not owned, must outlive the model. Parameters start at zero: load them.
  static StatusOr<std::unique_ptr<ParallelGpt>> Create(const ParallelGptOptions& options,
                                                       const ParallelMesh& mesh,
                                                       ProcessGroups* groups, Ops* ops);
  ~ParallelGpt();

  const GptLayout& layout() const { return layout_; }
  const ParallelMesh& mesh() const { return mesh_; }
  int rank() const { return options_.rank; }

  // Takes this rank's part of a global parameter arena (every rank passes the same one).
  void LoadGlobalParams(const float* params);

  // What this rank reads of a checkpoint's global arenas to resume, of the parameters and
  // of the AdamW moments alike: its dp share of its local arena (under ZeRO the slice it
  // owns).
  std::vector<ElementRange> ShareRanges() const;
  // Take this rank's parameters / moments (and the optimizer's step count) from parts
  // holding at least ShareRanges() (CHECKed), gathering what other dp
  // ranks read. Collective over dp: every rank of the mesh calls them together. Errors are
  // communication failures.
  Status LoadParams(const GlobalPart& params);
  Status LoadOptimizer(const GlobalPart& m, const GlobalPart& v, int64_t step_count);
  int64_t optimizer_steps() const { return optimizer_->step_count(); }

  // The fp16 loss scaler's state (null in other precisions), and its restore from a
  // checkpoint of an fp16 run (InvalidArgument for a state that is not one).
  const LossScalerState* loss_scaler_state() const {
    return scaler_ != nullptr ? &scaler_->state() : nullptr;
  }
  Status RestoreLossScaler(const LossScalerState& state);

  // One optimizer step at learning rate `lr` over mesh.micro_batches() micro-batches from
  // `next_batch`. Errors are communication failures (a dead or hung peer).
  // `votes` ride in the step's all-reduce: StepResult::checkpoint_voted (checkpoint_busy) is
  // true on every rank when any rank said so.
  StatusOr<StepResult> Step(const BatchFn& next_batch, double lr, StepVotes votes = {});

  // Mean loss over validation batches [0, batches), split over the dp ranks; with `losses`,
  // each batch's per-position losses handed to it too, where they are computed. A
  // `row_length` other than T (0) runs the batches as B * T / row_length rows of row_length
  // positions (it must divide T), in the same activation memory, which is laid out for
  // training's (B, T) again before it returns.
  StatusOr<double> Evaluate(int64_t batches, const EvalBatchFn& batch,
                            const EvalLossesFn& losses = nullptr, int row_length = 0);
  // x[0..n) summed over every rank of the mesh, in place, on every rank: what Evaluate's
  // `losses` gathered, each rank a part. Collective; errors are communication failures.
  Status SumOverRanks(double* x, size_t n);

  // This rank's part of a sharded checkpoint, copied to host memory: a dp slice of the local
  // arena (the ZeRO shard this rank owns; under plain data parallelism an even split of the
  // replicas), minus the non-primary tensor copies, as runs of the global arenas. The parts
  // of all ranks tile the global arenas exactly. Local, no communication.
  struct OwnedState {
    std::vector<StridedRun> runs;
    HostFloats params, m, v;  // the runs' elements, in run order
  };
  // `reuse`'s vectors are filled in place (resized as needed, from their own allocators), so
  // that a caller that keeps them between calls copies into memory that is already there.
  OwnedState ExportOwned(OwnedState reuse = {});

  // Assembles the global parameters (and, when m and v are given, the AdamW moments) on
  // world rank 0; other ranks' vectors are left empty. Collective over the world.
  Status GatherGlobal(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v);

 private:
  ParallelGpt(const ParallelGptOptions& options, const ParallelMesh& mesh, GptLayout layout,
              ProcessGroups* groups, Ops* ops);
  // One activation set of a chunk: its activations and the sends still reading them (the
  // output, by the activation's send; the input gradient, by the gradient's).
  struct ActivationSet {
    std::unique_ptr<StageActivations> acts;
    std::vector<std::unique_ptr<Request>> act_sends, grad_sends;
  };
  // The set micro-batch (or evaluation batch) i of `chunk` uses.
  ActivationSet& SetOf(int chunk, int64_t i);
  // Lays every activation set out for (B, T) (StageActivations::Ensure). No send may be in
  // flight.
  void LayOutActivations(int B, int T);
  // Evaluate in the activations' present layout.
  StatusOr<double> EvaluateBatches(int64_t batches, const EvalBatchFn& batch,
                                   const EvalLossesFn& losses);
  // Where a transfer goes: a communicator and the peer's index in it.
  struct Link {
    Communicator* comm;
    int peer;
  };
  // The previous (next) virtual stage of this stage's `chunk`, for activations (gradients):
  // the neighbouring stage on pp (pp_grad), or across the ring's back edge on pp_wrap
  // (pp_grad_wrap) between the last stage's chunk c and the first stage's chunk c + 1.
  Link ActivationFrom(int chunk) const;
  Link ActivationTo(int chunk) const;
  Link GradientFrom(int chunk) const;
  Link GradientTo(int chunk) const;
  Status RunForward(const PipeAction& action, const BatchFn& next_batch, double* loss_sum);
  Status RunBackward(const PipeAction& action);
  Status Send(const Link& to, std::vector<std::unique_ptr<Request>>* sends, const float* data,
              uint64_t tag);
  Status Recv(const Link& from, float* data, uint64_t tag);
  // What this stage has waited in its pipeline transfers (StepResult::pp_wait_s).
  double PipelineWaitSeconds() const;
  static Status Wait(std::vector<std::unique_ptr<Request>>* sends);
  Status WaitAllSends();
  Status SyncTiedEmbedding(float* grads);
  double OwnedGradSumSquares();
  // The gradient of the loss each micro-batch's backward starts from, and the factor the
  // reduced gradients then carry (1 in fp32; the loss scale over dp in mixed precision).
  float BackwardSeed() const;
  double GradMultiplier() const;
  // Collects this rank's whole local arenas of params (and m, v) into host vectors.
  Status ExportLocal(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v);

  const ParallelGptOptions options_;
  const ParallelMesh mesh_;
  const ParallelMesh::Coord coord_;
  const GptLayout layout_;
  ProcessGroups* groups_;
  Ops* ops_;
  std::vector<GptStage> stages_;  // one per model chunk
  std::vector<PipeAction> schedule_;
  std::unique_ptr<TrainingMemory> memory_;
  std::unique_ptr<NarrowedParams> narrowed_;   // mixed precision only
  StageMemory* stage_memory_;                  // narrowed_, else memory_
  std::unique_ptr<DynamicLossScaler> scaler_;  // fp16 only
  std::unique_ptr<AdamW> optimizer_;
  // Per chunk; micro-batch i of a chunk uses set i % its size (pipeline.h: MaxInFlight).
  std::vector<std::vector<ActivationSet>> sets_;
  std::vector<std::pair<size_t, size_t>> norm_ranges_;  // runs of primary tensors
};

}  // namespace drover::engine::parallel
