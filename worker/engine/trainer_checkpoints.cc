// The trainer's checkpoints (trainer.h): the snapshot of a step, the asynchronous or
// synchronous save, the restore of the newest usable checkpoint on every rank, and the
// rollback of a loss spike to it. The rest of the trainer is in trainer.cc.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>

#include "worker/engine/ckpt/agreed_load.h"
#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/ckpt/checkpoint_model.h"
#include "worker/engine/trainer.h"

namespace drover::engine {
namespace {

int64_t WallNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status Trainer::RestoreLatest(const std::string& choice_key) {
  // Every rank loads the one checkpoint rank 0 chose, reading its part of it at the same time
  // as the others; a checkpoint some rank finds broken is skipped by all (agreed_load.h).
  std::string path;
  ckpt::AgreedLoadOptions load;
  load.dir = ckpt_dir_;
  load.rank = options_.rank;
  load.world_size = options_.world_size;
  load.store = options_.store;
  load.key = choice_key;
  load.timeout = options_.connect_timeout;
  // A large checkpoint on slow storage can take longer to read than the hang timeout.
  load.progress = [this](const std::string& step_dir, int64_t read, int64_t total) {
    ReportWork(read == 0, [&] {
      return fmt::format("restoring checkpoint {}: {:.1f} of {:.1f} MB read", step_dir, read / 1e6,
                         total / 1e6);
    });
  };
  auto want = [&](const std::string& step_dir,
                  const v1::CheckpointManifest& m) -> StatusOr<ckpt::PartRequest> {
    const GptConfig saved = ckpt::ModelConfigOf(m.model());
    if (!(saved == config_)) {
      return InvalidArgumentError("checkpoint " + step_dir + " holds a model " +
                                  DescribeConfig(saved) + ", the job spec asks for " +
                                  DescribeConfig(config_) +
                                  "; use another checkpoint.dir (or `drover train --fresh`)");
    }
    const size_t n = GptNumParams(config_);
    if (m.num_params() != static_cast<int64_t>(n)) {
      return DataLossError("checkpoint " + step_dir + " has " + std::to_string(m.num_params()) +
                           " parameters, its model has " + std::to_string(n));
    }
    std::vector<ElementRange> share = model_->ShareRanges();
    return ckpt::PartRequest{share, share};
  };
  StatusOr<ckpt::CheckpointPart> part = ckpt::LoadAgreedCheckpoint(load, want, &path);
  if (!part.ok()) return part.status();
  const v1::CheckpointManifest& m = part->meta;
  Status loaded = model_->LoadParams(part->params);
  if (loaded.ok()) loaded = model_->LoadOptimizer(part->adam_m, part->adam_v, m.optimizer_step());
  if (!loaded.ok()) return loaded.WithContext("restoring checkpoint " + path);
  // The loss scale carries over between fp16 runs only; from any other checkpoint an fp16
  // run starts at the initial scale (it finds its level within a few steps).
  if (m.precision() == "fp16") {
    LossScalerState scaler;
    scaler.scale = static_cast<float>(m.loss_scaler().scale());
    scaler.good_steps = m.loss_scaler().good_steps();
    scaler.skipped_steps = m.loss_scaler().skipped_steps();
    Status st = model_->RestoreLossScaler(scaler);
    if (!st.ok()) return DataLossError("checkpoint " + path + ": " + st.message());
  }
  SamplerState s;
  s.epoch = static_cast<uint64_t>(m.train_sampler().epoch());
  s.offset = static_cast<uint64_t>(m.train_sampler().offset());
  s.consumed_samples = static_cast<uint64_t>(m.train_sampler().consumed_samples());
  Status st = loader_->Restore(s);
  if (!st.ok()) return st.WithContext("checkpoint " + path + " sampler position");
  step_ = m.step();
  resumed_from_ = m.step();
  rollbacks_ = std::max(rollbacks_, m.rollbacks());
  last_checkpoint_step_ = m.step();
  int64_t total_bytes = 0;
  for (const v1::CheckpointShard& sh : m.shards()) total_bytes += sh.bytes();
  spdlog::info(
      "resumed from checkpoint {} (step {}, {} samples consumed; read {:.1f} of its {:.1f} MB)",
      path, m.step(), m.consumed_samples(), part->bytes_read / 1e6, total_bytes / 1e6);
  return OkStatus();
}

ckpt::ShardSnapshot Trainer::MakeSnapshot() {
  const JobSpec& spec = options_.spec;
  ckpt::ShardSnapshot snap;
  v1::CheckpointManifest& meta = snap.meta;
  meta.set_job_id(options_.job_id);
  meta.set_attempt(options_.attempt);
  meta.set_step(step_);
  const SamplerState s = loader_->state();
  meta.set_consumed_samples(static_cast<int64_t>(s.consumed_samples));
  meta.mutable_train_sampler()->set_epoch(static_cast<int64_t>(s.epoch));
  meta.mutable_train_sampler()->set_offset(static_cast<int64_t>(s.offset));
  meta.mutable_train_sampler()->set_consumed_samples(static_cast<int64_t>(s.consumed_samples));
  *meta.mutable_model() = ckpt::ModelConfigProto(config_);
  for (const TensorInfo& t : GptTensorTable(config_)) {
    v1::CheckpointTensor* pt = meta.add_tensors();
    pt->set_name(t.name);
    pt->set_offset(static_cast<int64_t>(t.offset));
    pt->set_numel(static_cast<int64_t>(t.numel));
    for (int64_t d : t.shape) pt->add_shape(d);
    pt->set_decay(t.decay);
  }
  // The engine has no stochastic op (no dropout), so the seed is the whole RNG state.
  meta.set_rng_state(spec.train.seed);
  meta.set_precision(spec.precision.dtype);
  meta.mutable_loss_scaler()->set_scale(1.0);  // no loss scaling but in fp16
  if (const LossScalerState* scaler = model_->loss_scaler_state(); scaler != nullptr) {
    meta.mutable_loss_scaler()->set_scale(scaler->scale);
    meta.mutable_loss_scaler()->set_good_steps(scaler->good_steps);
    meta.mutable_loss_scaler()->set_skipped_steps(scaler->skipped_steps);
  }
  meta.set_world_size(options_.world_size);
  meta.set_optimizer_step(model_->optimizer_steps());
  meta.set_created_ms(WallNowMs());
  meta.set_num_params(static_cast<int64_t>(GptNumParams(config_)));
  meta.set_rollbacks(rollbacks_);
  // The copy aside: this rank's owned ranges, in host memory, before the next step runs,
  // into the memory of the last written shard where there is one (async_writer.h).
  ckpt::RankShard recycled = writer_->TakeRecycled();
  parallel::ParallelGpt::OwnedState buffers;
  buffers.params = std::move(recycled.params);
  buffers.m = std::move(recycled.adam_m);
  buffers.v = std::move(recycled.adam_v);
  parallel::ParallelGpt::OwnedState owned = model_->ExportOwned(std::move(buffers));
  snap.shard.rank = options_.rank;
  for (const StridedRun& r : owned.runs) {
    v1::CheckpointRun& run = snap.shard.runs.emplace_back();
    run.set_begin(static_cast<int64_t>(r.begin));
    run.set_length(static_cast<int64_t>(r.length));
    run.set_stride(static_cast<int64_t>(r.stride));
    run.set_count(static_cast<int64_t>(r.count));
  }
  snap.shard.params = std::move(owned.params);
  snap.shard.adam_m = std::move(owned.m);
  snap.shard.adam_v = std::move(owned.v);
  return snap;
}

Status Trainer::RollBack(const StepMetrics& m) {
  const SpikeRollbackSpec& spec = options_.spec.fault_tolerance.spike_rollback;
  const int64_t spike_step = step_;
  const uint64_t spike_consumed = loader_->state().consumed_samples;
  const std::string why = std::isfinite(m.loss) ? fmt::format(
                                                      "loss {:.4f} is over {} x the recent "
                                                      "mean {:.4f}",
                                                      m.loss, spec.factor, spike_->mean())
                                                : std::string("loss is not finite");
  // A run that spikes again after every rollback is not cured by more of them.
  constexpr int64_t kMaxRollbacks = 10;
  if (++rollbacks_ > kMaxRollbacks) {
    return InternalError("loss spike at step " + std::to_string(spike_step) + " (" + why +
                         ") after " + std::to_string(kMaxRollbacks) +
                         " rollbacks already: giving up (fault_tolerance.spike_rollback)");
  }
  // The newest checkpoint must be on disk (a write in flight is finished first).
  (void)FlushCheckpoints();
  Status restored = RestoreLatest("rollback-" + std::to_string(rollbacks_));
  if (!restored.ok()) {
    if (restored.code() != StatusCode::kNotFound || !std::isfinite(m.loss)) {
      return restored.WithContext("rolling back the loss spike at step " +
                                  std::to_string(spike_step) + " (" + why + ")");
    }
    // Nothing to go back to yet: the spike stays in the run, counted.
    spdlog::warn("loss spike at step {} ({}); no checkpoint to roll back to, going on", spike_step,
                 why);
    spike_->Reset();
    return OkStatus();
  }
  // Skip the data seen from the checkpoint through the spike, and skip_steps batches more
  // (PaLM's remedy: the batches around a spike are what set it off).
  const uint64_t skip_to =
      spike_consumed + static_cast<uint64_t>(spec.skip_steps) *
                           static_cast<uint64_t>(options_.spec.train.global_batch);
  RETURN_IF_ERROR(loader_->SkipTo(skip_to).WithContext("skipping the data of the spike"));
  spike_->Reset();
  spdlog::warn(
      "loss spike at step {} ({}): rolled back to step {} and skipped the data through step {} "
      "(rollback {})",
      spike_step, why, step_, spike_step + spec.skip_steps, rollbacks_);
  if (options_.listener != nullptr) options_.listener->OnRollback(spike_step, step_, rollbacks_);
  return OkStatus();
}

// A rank whose previous checkpoint is still in flight (its write waits on a slow disk, on a
// peer's report, or on the coordinator's confirmation while it restarts) would hold its
// training thread in Submit, and with it every peer in the next collective, until the
// collectives' deadline failed the attempt. So a checkpoint due while any rank's previous
// one is late (TrainerOptions::checkpoint_defer_after) or waits on a coordinator it cannot
// reach (the step's all-reduce says so on every rank alike) waits for the first step at
// which none is, and training goes on. A write that comes to wait on the coordinator after
// that vote, during the step, is not waited for either: Submit gives the rank's part of the
// new checkpoint up (may_give_up), and that one checkpoint is abandoned.
Status Trainer::SaveOrDeferCheckpoint() {
  if (checkpoint_busy_) {
    if (checkpoint_deferred_since_ < 0) {
      checkpoint_deferred_since_ = step_;
      if (is_rank0()) {
        spdlog::info(
            "the checkpoint of step {} is deferred: a rank is still saving the previous one "
            "(training goes on meanwhile)",
            step_);
      }
    }
    return OkStatus();
  }
  if (checkpoint_deferred_since_ >= 0 && is_rank0()) {
    spdlog::info("saving the checkpoint deferred since step {} at step {}",
                 checkpoint_deferred_since_, step_);
  }
  checkpoint_deferred_since_ = -1;
  return SaveCheckpoint(options_.spec.checkpoint.async);
}

Status Trainer::SaveCheckpoint(bool async) {
  last_checkpoint_step_ = step_;
  last_checkpoint_ms_ = Now();
  // A failed write is the disk's trouble, not the job's: it was reported (the listener) and
  // the next interval tries again. Only the barrier's errors (a peer gone) are returned.
  Status written = async ? writer_->Submit(MakeSnapshot(), /*may_give_up=*/true)
                         : writer_->WriteNow(MakeSnapshot());
  if (!written.ok()) spdlog::warn("a checkpoint failed: {}", written.ToString());
  // A synchronous save keeps every rank away from the collectives until all shards are in.
  return async ? OkStatus() : StoreBarrier("checkpoint-" + std::to_string(step_));
}

Status Trainer::FinishDrain() {
  const int64_t step = step_;
  if (Status written = writer_->Flush(); !written.ok()) {
    return CancelledError("drained after step " + std::to_string(step) +
                          ", but its checkpoint failed: " + written.ToString());
  }
  // Rank 0 commits in Flush. Another rank's part is durable and reported now; the commit is
  // rank 0's, seen here when step_N/ appears (the directory every rank writes into).
  const std::string committed =
      ckpt_dir_ + "/" + ckpt::StepDirName(step) + "/" + ckpt::kManifestFile;
  const auto give_up = std::chrono::steady_clock::now() + options_.checkpoint_collect_timeout;
  while (!is_rank0() && !std::filesystem::exists(committed)) {
    if (StopRequested() || std::chrono::steady_clock::now() >= give_up) {
      return CancelledError("drained after step " + std::to_string(step) +
                            " without seeing its checkpoint committed (" + committed + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  spdlog::info(
      "drained: checkpoint step {} is committed; stopping (its node is taken out of service)",
      step);
  drained_ = true;
  // Before this process's sockets close: a peer whose collective fails next finds why.
  if (options_.store != nullptr) {
    (void)options_.store->Set(kDrainedKey, "rank " + std::to_string(options_.rank) +
                                               " drained after checkpoint step " +
                                               std::to_string(step) + " was committed");
  }
  return CancelledError("drained after checkpoint step " + std::to_string(step) +
                        " was committed (its node is taken out of service)");
}

Status Trainer::PeerDrained(const Status& failed) {
  if (options_.store == nullptr) return failed;
  StatusOr<std::string> why = options_.store->Get(kDrainedKey, std::chrono::milliseconds(0));
  if (!why.ok()) return failed;
  // The attempt ends for the drain, not for this rank's failure, whichever exit the
  // coordinator hears of first.
  drained_ = true;
  spdlog::warn("{}: the job stops here too ({})", *why, failed.ToString());
  return CancelledError(
      *why + " (its node is taken out of service); this rank stops too: " + failed.message());
}

Status Trainer::FlushCheckpoints() { return writer_ != nullptr ? writer_->Flush() : OkStatus(); }

void Trainer::OnCheckpointComplete(const v1::CheckpointManifest& meta, const std::string& path) {
  spdlog::info("checkpoint step {} complete: {}", meta.step(), path);
  if (options_.listener == nullptr) return;
  v1::CheckpointRecord record;
  record.set_job_id(meta.job_id());
  record.set_attempt(meta.attempt());
  record.set_step(meta.step());
  record.set_path(std::filesystem::absolute(path).string());
  record.set_consumed_samples(meta.consumed_samples());
  record.set_created_ms(meta.created_ms());
  record.set_world_size(meta.world_size());
  options_.listener->OnCheckpoint(record);
}

}  // namespace drover::engine
