#include "worker/engine/parallel/parallel_gpt.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "worker/engine/optim/grad_clip.h"
#include "worker/engine/parallel/data_parallel.h"
#include "worker/engine/parallel/zero_sharded.h"

namespace drover::engine::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Point-to-point tags between pipeline stages: activations and their gradients travel on
// separate tags (they cross in opposite directions), numbered by the sending virtual stage
// and the micro-batch (Tag). NCCL ignores tags: there the order of the transfers between two ranks
// on one communicator is what matches them, and the schedules keep it (pipeline.h).
constexpr uint64_t kActivationTag = uint64_t{1} << 32;
constexpr uint64_t kGradientTag = uint64_t{2} << 32;
constexpr uint64_t kEvalTag = uint64_t{3} << 32;
// The gather of a checkpoint or model on world rank 0: one tag per arena.
constexpr uint64_t kGatherTag = uint64_t{4} << 32;

// Runs of consecutive tensors whose `primary` flag is set, merged: the ranges whose
// squared gradients this rank adds to the global norm (each element once in the world).
std::vector<std::pair<size_t, size_t>> PrimaryRuns(const GptLayout& layout) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (const LocalTensor& t : layout.tensors()) {
    if (!t.primary) continue;
    if (!runs.empty() && runs.back().second == t.offset) {
      runs.back().second += t.numel;
    } else {
      runs.emplace_back(t.offset, t.offset + t.numel);
    }
  }
  return runs;
}

// The techniques, one function each, applied by Create in this order: what a rank holds
// depends on tensor and pipeline parallelism, how its gradients are shared on data
// parallelism over that, and the optimizer on what the rank owns after all three.

// 1 + 2. Tensor and pipeline parallelism: the layers of this rank's stage, each tensor cut
// to its tensor-parallel part (the stage's blocks all-reduce over the tp group).
StatusOr<GptLayout> ShardModel(const GptConfig& config, const ParallelMesh& mesh,
                               const ParallelMesh::Coord& c) {
  return GptLayout::Create(config, c.pp, mesh.pp(), c.tp, mesh.tp(), mesh.pp_layers(),
                           mesh.pp_chunks());
}

// 2. Pipeline parallelism: this stage's order of forwards and backwards in a step.
std::vector<PipeAction> SchedulePipeline(PipelineSchedule schedule, const ParallelMesh& mesh,
                                         const ParallelMesh::Coord& c) {
  return StageSchedule(schedule, mesh.pp(), c.pp, mesh.micro_batches(), mesh.pp_chunks());
}

// 3. Data parallelism and ZeRO over the dp group. With a pipeline, the tied embedding's
// unit waits for the sum between first and last stage before its dp reduction.
// Under hybrid sharding dp is the shard group and `replica` the same shard's other holders.
std::unique_ptr<TrainingMemory> ApplyDataParallel(const GptLayout* layout, Ops* ops,
                                                  const ParallelMesh& mesh, Communicator* dp,
                                                  Communicator* replica, size_t bucket_floats) {
  if (mesh.zero_stage() >= 2 && dp != nullptr) {
    return std::make_unique<ShardedMemory>(layout, ops, dp, replica, mesh.zero_stage());
  }
  std::vector<int> deferred;
  if (mesh.pp() > 1 && layout->first_stage()) deferred.push_back(layout->embedding_unit());
  if (mesh.pp() > 1 && layout->last_stage()) deferred.push_back(layout->head_unit());
  return std::make_unique<DataParallelMemory>(layout, ops, dp, std::min(mesh.zero_stage(), 1),
                                              bucket_floats, std::move(deferred), replica);
}

// 4. AdamW over the range this rank owns (its dp shard under ZeRO, else everything).
std::unique_ptr<AdamW> ShardOptimizer(const GptLayout& layout, const TrainingMemory& memory,
                                      const AdamWConfig& config, Ops* ops) {
  return std::make_unique<AdamW>(DecayRangesOf(layout.tensors()), layout.num_params(), config,
                                 memory.owned_begin(), memory.owned_end(), ops);
}

}  // namespace

StatusOr<std::unique_ptr<ParallelGpt>> ParallelGpt::Create(const ParallelGptOptions& options,
                                                           const ParallelMesh& mesh,
                                                           ProcessGroups* groups, Ops* ops) {
  ASSIGN_OR_RETURN(GptLayout layout, ShardModel(options.config, mesh, mesh.CoordOf(options.rank)));
  return std::unique_ptr<ParallelGpt>(
      new ParallelGpt(options, mesh, std::move(layout), groups, ops));
}

ParallelGpt::ParallelGpt(const ParallelGptOptions& options, const ParallelMesh& mesh,
                         GptLayout layout, ProcessGroups* groups, Ops* ops)
    : options_(options),
      mesh_(mesh),
      coord_(mesh.CoordOf(options.rank)),
      layout_(std::move(layout)),
      groups_(groups),
      ops_(ops),
      schedule_(SchedulePipeline(options.schedule, mesh, coord_)),
      memory_(ApplyDataParallel(&layout_, ops, mesh, groups->dp.get(), groups->dp_replica.get(),
                                options.bucket_floats)),
      narrowed_(
          options.precision == Precision::kFp32
              ? nullptr
              : std::make_unique<NarrowedParams>(&layout_, ops, options.precision, memory_.get())),
      stage_memory_(narrowed_ != nullptr ? static_cast<StageMemory*>(narrowed_.get())
                                         : memory_.get()),
      scaler_(options.precision == Precision::kFp16
                  ? std::make_unique<DynamicLossScaler>(options.loss_scaler)
                  : nullptr),
      optimizer_(ShardOptimizer(layout_, *memory_, options.adam, ops)),
      norm_ranges_(PrimaryRuns(layout_)) {
  const int chunks = layout_.chunks();
  stages_.reserve(chunks);
  sets_.resize(chunks);
  for (int c = 0; c < chunks; ++c) {
    stages_.emplace_back(&layout_, ops, groups->tp.get(), options.precision, c);
    for (int i = MaxInFlight(schedule_, c); i > 0; --i) {
      ActivationSet& set = sets_[c].emplace_back();
      set.acts = std::make_unique<StageActivations>(&layout_, ops, options.precision, c,
                                                    options.recompute);
    }
  }
  LayOutActivations(options.micro_batch, options.seq_len);
}

ParallelGpt::~ParallelGpt() {
  // Sends in flight read activation buffers: let them finish (or fail) first.
  (void)WaitAllSends();
}

void ParallelGpt::LoadGlobalParams(const float* params) {
  std::vector<float> local(layout_.num_params());
  layout_.GlobalToLocal(params, local.data());
  memory_->ImportParams(local.data());
  if (narrowed_ != nullptr) narrowed_->Invalidate();
}

Status ParallelGpt::RestoreLossScaler(const LossScalerState& state) {
  if (scaler_ == nullptr) return OkStatus();
  return scaler_->Restore(state);
}

namespace {

// The global elements behind local elements [lo, hi) of `layout`.
std::vector<ElementRange> GlobalRangesOf(const GptLayout& layout, size_t lo, size_t hi) {
  std::vector<ElementRange> out;
  layout.ForEachRunIn(lo, hi, [&](size_t g, size_t, size_t n) { out.push_back({g, g + n}); });
  return out;
}

// Local elements [lo, hi) of `layout` from `part`, into local[0, hi - lo).
void PartToLocal(const GptLayout& layout, const GlobalPart& part, size_t lo, size_t hi,
                 float* local) {
  layout.ForEachRunIn(lo, hi, [&](size_t g, size_t l, size_t n) {
    const float* from = part.At(g, n);
    std::copy(from, from + n, local + (l - lo));
  });
}

}  // namespace

// A restore reads this rank's dp share of its local arena, of the parameters and the
// moments alike, and gathers the rest from the other dp ranks (TrainingMemory::GatherShares):
// the replicas of a stage read the checkpoint once between them, not once each.
std::vector<ElementRange> ParallelGpt::ShareRanges() const {
  return GlobalRangesOf(layout_, memory_->share_begin(), memory_->share_end());
}

Status ParallelGpt::LoadParams(const GlobalPart& params) {
  std::vector<float> local(layout_.num_params());
  const size_t lo = memory_->share_begin(), hi = memory_->share_end();
  PartToLocal(layout_, params, lo, hi, local.data() + lo);
  // Under ZeRO-3 the owned range is all this rank keeps (ImportParams reads only it): the
  // share is that range, or under hybrid sharding a replica's part of it.
  const bool owned_is_share = memory_->owned_begin() == lo && memory_->owned_end() == hi;
  if (!memory_->params_sharded() || !owned_is_share) {
    RETURN_IF_ERROR(memory_->GatherShares(local.data()));
  }
  memory_->ImportParams(local.data());
  if (narrowed_ != nullptr) narrowed_->Invalidate();
  return OkStatus();
}

Status ParallelGpt::LoadOptimizer(const GlobalPart& m, const GlobalPart& v, int64_t step_count) {
  const size_t begin = memory_->owned_begin(), end = memory_->owned_end();
  const size_t lo = memory_->share_begin(), hi = memory_->share_end();
  // The owned range is the share (ZeRO), or gathered from the shares: of the whole local
  // arena at stage 0, of the replicas' parts under hybrid sharding.
  const bool gather = begin != lo || end != hi;
  DROVER_CHECK(begin <= lo && hi <= end);
  std::vector<float> local(gather ? layout_.num_params() : end - begin);
  const size_t at = gather ? 0 : begin;  // local[i] is element at + i
  for (auto [part, moments] : {std::pair{&m, optimizer_->m()}, std::pair{&v, optimizer_->v()}}) {
    PartToLocal(layout_, *part, lo, hi, local.data() + (lo - at));
    if (gather) RETURN_IF_ERROR(memory_->GatherShares(local.data()));
    ops_->FromHost(moments, local.data() + (begin - at), end - begin);
  }
  optimizer_->set_step_count(step_count);
  return OkStatus();
}

namespace {

// The tag of a transfer of micro-batch i sent by virtual stage `from` (chunk c of stage s
// is virtual stage c * pp + s), in a step of m micro-batches.
uint64_t Tag(int from, int i, int m) { return static_cast<uint64_t>(from) * m + i; }

// What passes between stages: one micro-batch's (B, T, C) activations or their gradient.
size_t BoundaryBytes(const ParallelGptOptions& o) {
  return sizeof(float) * o.micro_batch * o.seq_len * static_cast<size_t>(o.config.channels);
}

}  // namespace

ParallelGpt::ActivationSet& ParallelGpt::SetOf(int chunk, int64_t i) {
  std::vector<ActivationSet>& sets = sets_[static_cast<size_t>(chunk)];
  return sets[static_cast<size_t>(i % static_cast<int64_t>(sets.size()))];
}

Status ParallelGpt::Wait(std::vector<std::unique_ptr<Request>>* sends) {
  Status first;
  for (auto& request : *sends) {
    Status st = request->Wait();
    if (first.ok()) first = st;
  }
  sends->clear();
  return first;
}

Status ParallelGpt::WaitAllSends() {
  Status first;
  for (auto& chunk : sets_) {
    for (ActivationSet& set : chunk) {
      for (auto* sends : {&set.act_sends, &set.grad_sends}) {
        Status st = Wait(sends);
        if (first.ok()) first = st;
      }
    }
  }
  return first;
}

// The ring of virtual stages (pipeline.h): chunk c of stage s follows chunk c of stage s - 1,
// and chunk c of the first stage follows chunk c - 1 of the last (member 1 of the wrap
// groups; the first stage is member 0).
ParallelGpt::Link ParallelGpt::ActivationFrom(int chunk) const {
  if (coord_.pp > 0) return {groups_->pp.get(), coord_.pp - 1};
  DROVER_CHECK(chunk > 0 && groups_->pp_wrap != nullptr);
  return {groups_->pp_wrap.get(), 1};
}

ParallelGpt::Link ParallelGpt::ActivationTo(int chunk) const {
  if (coord_.pp < mesh_.pp() - 1) return {groups_->pp.get(), coord_.pp + 1};
  DROVER_CHECK(chunk < layout_.chunks() - 1 && groups_->pp_wrap != nullptr);
  return {groups_->pp_wrap.get(), 0};
}

ParallelGpt::Link ParallelGpt::GradientFrom(int chunk) const {
  Communicator* grads = groups_->pp_grad != nullptr ? groups_->pp_grad.get() : groups_->pp.get();
  if (coord_.pp < mesh_.pp() - 1) return {grads, coord_.pp + 1};
  DROVER_CHECK(chunk < layout_.chunks() - 1 && groups_->pp_grad_wrap != nullptr);
  return {groups_->pp_grad_wrap.get(), 0};
}

ParallelGpt::Link ParallelGpt::GradientTo(int chunk) const {
  Communicator* grads = groups_->pp_grad != nullptr ? groups_->pp_grad.get() : groups_->pp.get();
  if (coord_.pp > 0) return {grads, coord_.pp - 1};
  DROVER_CHECK(chunk > 0 && groups_->pp_grad_wrap != nullptr);
  return {groups_->pp_grad_wrap.get(), 1};
}

Status ParallelGpt::Send(const Link& to, std::vector<std::unique_ptr<Request>>* sends,
                         const float* data, uint64_t tag) {
  ASSIGN_OR_RETURN(std::unique_ptr<Request> request,
                   to.comm->Isend(data, BoundaryBytes(options_), to.peer, tag));
  sends->push_back(std::move(request));
  return OkStatus();
}

Status ParallelGpt::Recv(const Link& from, float* data, uint64_t tag) {
  return from.comm->Recv(data, BoundaryBytes(options_), from.peer, tag);
}

// The groups' counts, not the host's time in the calls: on a GPU the host also waits there
// for its own kernels before a receive, which is no wait for the neighbour; and a
// stream-ordered group (NCCL) counts a transfer once the compute stream has passed its wait
// for it, after the call. Sends count too: a stage whose send waits for its receiver stalls
// as well (one waited for late, as the schedules do, has mostly completed).
double ParallelGpt::PipelineWaitSeconds() const {
  double seconds = 0;
  for (const auto* group :
       {&groups_->pp, &groups_->pp_grad, &groups_->pp_wrap, &groups_->pp_grad_wrap}) {
    if (*group != nullptr) seconds += (*group)->wait_seconds();
  }
  return seconds;
}

Status ParallelGpt::RunForward(const PipeAction& action, const BatchFn& next_batch,
                               double* loss_sum) {
  const int c = action.chunk, i = action.micro_batch;
  ActivationSet& set = SetOf(c, i);
  StageActivations& a = *set.acts;
  if (c == 0) {
    // Every stage draws every micro-batch, so all ranks' samplers stay at one position (the
    // first stage embeds the inputs, the last scores the targets).
    RETURN_IF_ERROR(next_batch(a.inputs(), a.targets()));
  } else if (layout_.heads(c)) {
    // Drawn by the micro-batch's chunk-0 forward, whose set keeps them until its backward,
    // which comes after this chunk's.
    const int32_t* targets = SetOf(0, i).acts->targets();
    std::copy(targets, targets + options_.micro_batch * options_.seq_len, a.targets());
  }
  const int m = mesh_.micro_batches(), v = c * mesh_.pp() + coord_.pp;
  // Into the input, which no send reads: it may come while the set's last output still goes.
  if (!layout_.embeds(c)) {
    RETURN_IF_ERROR(Recv(ActivationFrom(c), a.input(), kActivationTag + Tag(v - 1, i, m)));
  }
  RETURN_IF_ERROR(Wait(&set.act_sends));  // the output this forward overwrites
  // The seed is the step's (the loss scale changes between steps only): the head's loss
  // gradient comes with its loss.
  ASSIGN_OR_RETURN(float loss,
                   stages_[c].Forward(a, *stage_memory_, GptStage::Pass::kTrain, BackwardSeed()));
  if (layout_.heads(c)) {
    *loss_sum += loss;
  } else {
    RETURN_IF_ERROR(
        Send(ActivationTo(c), &set.act_sends, a.output(), kActivationTag + Tag(v, i, m)));
  }
  return OkStatus();
}

Status ParallelGpt::RunBackward(const PipeAction& action) {
  const int c = action.chunk, i = action.micro_batch;
  ActivationSet& set = SetOf(c, i);
  StageActivations& a = *set.acts;
  memory_->SetLastMicroBatch(i == mesh_.micro_batches() - 1);
  const int m = mesh_.micro_batches(), v = c * mesh_.pp() + coord_.pp;
  // The gradient buffer this backward receives into and writes is what the set's last
  // gradient send reads. (Waiting for it only here, and for the output only before the
  // forward's compute, is what keeps the schedules free of deadlock on NCCL: pipeline_test.)
  RETURN_IF_ERROR(Wait(&set.grad_sends));
  if (!layout_.heads(c)) {
    RETURN_IF_ERROR(Recv(GradientFrom(c), a.doutput(), kGradientTag + Tag(v + 1, i, m)));
  }
  RETURN_IF_ERROR(stages_[c].Backward(a, *stage_memory_, BackwardSeed()));
  if (!layout_.embeds(c)) {
    RETURN_IF_ERROR(Send(GradientTo(c), &set.grad_sends, a.dinput(), kGradientTag + Tag(v, i, m)));
  }
  return OkStatus();
}

Status ParallelGpt::SyncTiedEmbedding(float* grads) {
  if (groups_->emb == nullptr) return OkStatus();
  const int unit = layout_.first_stage() ? layout_.embedding_unit() : layout_.head_unit();
  // This tp rank's rows of wte (its vocabulary slice, or all of them), on both ends.
  const size_t wte = static_cast<size_t>(layout_.local_vocab()) * layout_.config().channels;
  return groups_->emb->AllReduce(grads + layout_.units()[unit].offset, wte, DataType::kFloat32,
                                 ReduceOp::kSum);
}

float ParallelGpt::BackwardSeed() const {
  const float m = static_cast<float>(mesh_.micro_batches());
  if (options_.precision == Precision::kFp32) return 1.0f / m;  // the mean over micro-batches
  // Mixed precision: the seed single-process training of the same global batch uses, one
  // over every micro-batch of the world (times the loss scale), so that the activation
  // gradients that are narrowed, and that overflow fp16 or not, are the same on any mesh.
  // The dp average then leaves the gradients dp times too small: GradMultiplier.
  const float scale = scaler_ != nullptr ? scaler_->scale() : 1.0f;
  return scale / (m * static_cast<float>(mesh_.dp()));
}

double ParallelGpt::GradMultiplier() const {
  if (options_.precision == Precision::kFp32) return 1.0;
  const double scale = scaler_ != nullptr ? scaler_->scale() : 1.0;
  return scale / mesh_.dp();
}

double ParallelGpt::OwnedGradSumSquares() {
  // Under plain data parallelism every dp rank holds the same reduced gradient, under
  // hybrid sharding every replica of the shard.
  if (memory_->owned_replica() != 0) return 0;
  const size_t begin = memory_->owned_begin(), end = memory_->owned_end();
  const float* grads = memory_->owned_grads();
  double sum = 0;
  for (const auto& [lo, hi] : norm_ranges_) {
    const size_t b = std::max(lo, begin), e = std::min(hi, end);
    if (e > b) sum += ops_->SumSquares(grads + (b - begin), e - b);
  }
  return sum;
}

StatusOr<StepResult> ParallelGpt::Step(const BatchFn& next_batch, double lr, StepVotes votes) {
  const double pipeline_waited = PipelineWaitSeconds();
  memory_->BeginStep();
  double loss_sum = 0;
  for (const PipeAction& action : schedule_) {
    if (action.kind == PipeAction::kForward) {
      RETURN_IF_ERROR(RunForward(action, next_batch, &loss_sum));
    } else {
      RETURN_IF_ERROR(RunBackward(action));
    }
  }
  RETURN_IF_ERROR(WaitAllSends());
  std::function<Status(float*)> sync;
  if (groups_->emb != nullptr) sync = [this](float* grads) { return SyncTiedEmbedding(grads); };
  RETURN_IF_ERROR(memory_->FinishGradients(sync));
  // The stream-ordered groups' calls of this step have completed, or one failed: nothing
  // that may be garbage (an aborted transfer's buffer) reaches the optimizer, the metrics or
  // a checkpoint. The host waits here for the GPU's backward anyway: the gradient norm below
  // is read on the host.
  RETURN_IF_ERROR(SyncAll(*groups_));
  // Forward and backward are over: what the stream did so far is what could hide behind
  // them (gradient reduction; ZeRO-3's gathers).
  StepResult r;
  r.comm_busy_s = memory_->comm_busy_seconds();
  r.comm_blocked_s = memory_->comm_blocked_seconds();
  r.comm_overlapped_waits_s = memory_->comm_overlapped_waits_seconds();

  // The loss of every micro-batch is counted once (last stage, tp rank 0), the squared
  // gradient of every parameter once (OwnedGradSumSquares); the votes of all.
  const bool counts_loss = layout_.last_stage() && coord_.tp == 0;
  double stats[4] = {counts_loss ? loss_sum : 0.0, OwnedGradSumSquares(),
                     votes.checkpoint ? 1.0 : 0.0, votes.checkpoint_busy ? 1.0 : 0.0};
  if (groups_->world != nullptr) {
    RETURN_IF_ERROR(groups_->world->AllReduce(stats, 4, DataType::kFloat64, ReduceOp::kSum));
  }
  r.checkpoint_voted = stats[2] > 0;
  r.checkpoint_busy = stats[3] > 0;
  r.loss = stats[0] / (static_cast<double>(mesh_.dp()) * mesh_.micro_batches());
  // What the reduced gradients are multiplied by (BackwardSeed): 1 in fp32.
  const double multiplier = GradMultiplier();
  if (scaler_ != nullptr) {
    // The squares of an inf or NaN anywhere make the world's sum non-finite, and every rank
    // sees the same sum: all skip together, and their scalers stay equal. (The sum of
    // squares of finite floats cannot overflow a double.)
    r.loss_scale = scaler_->scale();
    r.skipped = !scaler_->Update(!std::isfinite(stats[1]));
  }
  r.grad_norm = std::sqrt(stats[1]) / multiplier;
  const MemoryUsage usage = memory_->memory_usage();
  r.param_bytes = sizeof(float) * usage.params;
  r.grad_bytes = sizeof(float) * usage.grads;
  r.optimizer_bytes = 2 * sizeof(float) * optimizer_->size();
  r.working_bytes = sizeof(float) * usage.working;
  for (const std::vector<ActivationSet>& chunk : sets_) {
    for (const ActivationSet& set : chunk) r.activation_bytes += set.acts->bytes();
  }
  r.pp_wait_s = PipelineWaitSeconds() - pipeline_waited;
  // A skipped step leaves weights, moments and AdamW's step count as they were; the next
  // BeginStep discards the gradients.
  if (r.skipped) return r;
  // Unscaling and clipping are one multiplication.
  const double scale = ClipScale(r.grad_norm, options_.grad_clip) / multiplier;
  const size_t owned = memory_->owned_end() - memory_->owned_begin();
  if (scale != 1.0) ops_->Scale(memory_->owned_grads(), owned, static_cast<float>(scale));
  optimizer_->Step(memory_->owned_params(), memory_->owned_grads(), static_cast<float>(lr));
  const auto publish = Clock::now();
  RETURN_IF_ERROR(memory_->PublishParams());
  r.publish_s = SecondsSince(publish);
  if (narrowed_ != nullptr) narrowed_->Invalidate();
  return r;
}

StatusOr<double> ParallelGpt::Evaluate(int64_t batches, const EvalBatchFn& batch,
                                       const EvalLossesFn& losses, int row_length) {
  const int B = options_.micro_batch, T = options_.seq_len;
  if (row_length == 0 || row_length == T) return EvaluateBatches(batches, batch, losses);
  if (row_length < 0 || T % row_length != 0) {
    return InvalidArgumentError("evaluation rows of " + std::to_string(row_length) +
                                " positions do not divide train.seq_len " + std::to_string(T));
  }
  LayOutActivations(B * (T / row_length), row_length);
  StatusOr<double> mean = EvaluateBatches(batches, batch, losses);
  (void)WaitAllSends();  // after an error too: no send may read the old layout's buffers
  LayOutActivations(B, T);
  return mean;
}

void ParallelGpt::LayOutActivations(int B, int T) {
  // Every set, as the batches rotate over them.
  for (std::vector<ActivationSet>& chunk : sets_) {
    for (ActivationSet& set : chunk) set.acts->Ensure(B, T);
  }
}

StatusOr<double> ParallelGpt::EvaluateBatches(int64_t batches, const EvalBatchFn& batch,
                                              const EvalLossesFn& losses) {
  double sum = 0;
  std::vector<float> host_losses;
  int64_t count = 0;
  const int chunks = layout_.chunks();
  const size_t BT = static_cast<size_t>(options_.micro_batch) * options_.seq_len;
  // Every data-parallel rank runs as many passes, the ranks without a batch in the last one
  // running a pass of padding that counts for nothing: under ZeRO-3 each layer's forward
  // gathers its parameters from the other data-parallel ranks, which would wait for a pass
  // that never comes.
  const int64_t passes = (batches + mesh_.dp() - 1) / mesh_.dp();
  for (int64_t k = 0; k < passes; ++k) {  // k: activation sets rotate over a rank's passes
    const int64_t i = k * mesh_.dp() + coord_.dp;
    const bool padding = i >= batches;
    // Batch by batch, each through the chunks in order: forward only, so the transfers of
    // every stage follow (batch, virtual stage) order and none waits on a later one.
    for (int c = 0; c < chunks; ++c) {
      ActivationSet& set = SetOf(c, k);
      StageActivations& a = *set.acts;
      if (c == 0 && padding) {
        std::fill(a.inputs(), a.inputs() + BT, 0);
        std::fill(a.targets(), a.targets() + BT, 0);
      } else if (c == 0) {
        RETURN_IF_ERROR(batch(i, a.inputs(), a.targets()));
      } else if (layout_.heads(c)) {
        const int32_t* targets = SetOf(0, k).acts->targets();
        std::copy(targets, targets + BT, a.targets());
      }
      // Tagged by the sending virtual stage, as in training.
      const int virtuals = chunks * mesh_.pp(), v = c * mesh_.pp() + coord_.pp;
      const uint64_t tag = kEvalTag + static_cast<uint64_t>(k) * virtuals;
      if (!layout_.embeds(c)) RETURN_IF_ERROR(Recv(ActivationFrom(c), a.input(), tag + v - 1));
      RETURN_IF_ERROR(Wait(&set.act_sends));
      ASSIGN_OR_RETURN(float loss, stages_[c].Forward(a, *stage_memory_, GptStage::Pass::kEval));
      if (layout_.heads(c)) {
        if (padding) continue;
        sum += loss;
        ++count;
        if (losses != nullptr && coord_.tp == 0) {
          host_losses.resize(BT);
          ops_->ToHost(host_losses.data(), a.losses(), host_losses.size());
          losses(i, host_losses.data());
        }
      } else {
        RETURN_IF_ERROR(Send(ActivationTo(c), &set.act_sends, a.output(), tag + v));
      }
    }
  }
  RETURN_IF_ERROR(WaitAllSends());
  RETURN_IF_ERROR(SyncAll(*groups_));  // as Step's: no loss from an aborted transfer
  const bool counts = layout_.last_stage() && coord_.tp == 0;
  double stats[2] = {counts ? sum : 0.0, counts ? static_cast<double>(count) : 0.0};
  if (groups_->world != nullptr) {
    RETURN_IF_ERROR(groups_->world->AllReduce(stats, 2, DataType::kFloat64, ReduceOp::kSum));
  }
  return stats[0] / std::max(stats[1], 1.0);
}

Status ParallelGpt::SumOverRanks(double* x, size_t n) {
  if (groups_->world == nullptr || n == 0) return OkStatus();
  return groups_->world->AllReduce(x, n, DataType::kFloat64, ReduceOp::kSum);
}

Status ParallelGpt::ExportLocal(std::vector<float>* params, std::vector<float>* m,
                                std::vector<float>* v) {
  const size_t n = layout_.num_params();
  params->assign(n, 0.0f);
  RETURN_IF_ERROR(memory_->ExportParams(params->data()));
  if (m == nullptr) return OkStatus();
  const size_t begin = memory_->owned_begin(), owned = memory_->owned_end() - begin;
  m->assign(n, 0.0f);
  v->assign(n, 0.0f);
  ops_->ToHost(m->data() + begin, optimizer_->m(), owned);
  ops_->ToHost(v->data() + begin, optimizer_->v(), owned);
  RETURN_IF_ERROR(memory_->GatherOwned(m->data()));
  return memory_->GatherOwned(v->data());
}

ParallelGpt::OwnedState ParallelGpt::ExportOwned(OwnedState reuse) {
  // Each rank writes its share of what it owns: replicas (stage 0's, hybrid sharding's) an
  // even part each.
  const size_t owned_begin = memory_->owned_begin();
  const size_t lo = memory_->share_begin(), hi = memory_->share_end();
  OwnedState out = std::move(reuse);
  // Fresh arrays come from the table's host allocator, page-locked on CUDA: the copies below
  // then run at the bus's rate, and the arrays are kept for the next snapshot.
  for (HostFloats* a : {&out.params, &out.m, &out.v}) {
    if (a->capacity() == 0) *a = HostFloats(HostFloatAllocator(ops_->host_allocator()));
  }
  std::vector<std::pair<size_t, size_t>> pieces;
  out.runs = layout_.GlobalRunsOf(lo, hi, &pieces);
  size_t total = 0;
  for (auto [b, e] : pieces) total += e - b;
  out.params.resize(total);
  out.m.resize(total);
  out.v.resize(total);
  // owned_params(), m() and v() start at element owned_begin of the local arena.
  size_t at = 0;
  for (auto [b, e] : pieces) {
    const size_t off = b - owned_begin, n = e - b;
    ops_->ToHost(out.params.data() + at, memory_->owned_params() + off, n);
    ops_->ToHost(out.m.data() + at, optimizer_->m() + off, n);
    ops_->ToHost(out.v.data() + at, optimizer_->v() + off, n);
    at += n;
  }
  return out;
}

Status ParallelGpt::GatherGlobal(std::vector<float>* params, std::vector<float>* m,
                                 std::vector<float>* v) {
  DROVER_CHECK((m == nullptr) == (v == nullptr));
  std::vector<float> local_p, local_m, local_v;
  RETURN_IF_ERROR(ExportLocal(&local_p, m ? &local_m : nullptr, m ? &local_v : nullptr));
  std::vector<std::vector<float>*> locals = {&local_p};
  std::vector<std::vector<float>*> globals = {params};
  if (m != nullptr) {
    locals.insert(locals.end(), {&local_m, &local_v});
    globals.insert(globals.end(), {m, v});
  }
  for (std::vector<float>* g : globals) g->clear();
  if (options_.rank != 0) {
    // dp rank 0 of every (pp, tp) coordinate holds its whole local arenas now.
    if (coord_.dp != 0) return OkStatus();
    for (size_t i = 0; i < locals.size(); ++i) {
      RETURN_IF_ERROR(groups_->world->Send(locals[i]->data(), sizeof(float) * locals[i]->size(), 0,
                                           kGatherTag + i));
    }
    return OkStatus();
  }
  const size_t total = layout_.global_num_params();
  for (std::vector<float>* g : globals) g->assign(total, 0.0f);
  for (int pp = 0; pp < mesh_.pp(); ++pp) {
    for (int tp = 0; tp < mesh_.tp(); ++tp) {
      const int src = mesh_.RankOf({0, pp, tp});
      ASSIGN_OR_RETURN(GptLayout layout,
                       GptLayout::Create(layout_.config(), pp, mesh_.pp(), tp, mesh_.tp(),
                                         mesh_.pp_layers(), mesh_.pp_chunks()));
      for (size_t i = 0; i < locals.size(); ++i) {
        std::vector<float> remote;
        const std::vector<float>* local = locals[i];
        if (src != 0) {
          remote.resize(layout.num_params());
          RETURN_IF_ERROR(groups_->world->Recv(remote.data(), sizeof(float) * remote.size(), src,
                                               kGatherTag + i));
          local = &remote;
        }
        layout.LocalToGlobal(local->data(), globals[i]->data(), /*primary_only=*/true);
      }
    }
  }
  return OkStatus();
}

}  // namespace drover::engine::parallel
