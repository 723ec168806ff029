#include "worker/engine/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <utility>

#include "worker/engine/model/model_file.h"
#include "worker/engine/optim/grad_clip.h"
#include "worker/engine/optim/lr_schedule.h"

namespace drover::engine {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int64_t WallNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Every token id must be below the vocabulary: the model CHECKs it, and bad data must be
// an error message, not an abort.
Status CheckTokenRange(const TokenDataset& data, int vocab_size, const std::string& what) {
  for (size_t s = 0; s < data.num_shards(); ++s) {
    const uint16_t* tokens = data.shard_data(s);
    const uint64_t n = data.shard_tokens(s);
    uint16_t max_token = 0;
    for (uint64_t i = 0; i < n; ++i) max_token = std::max(max_token, tokens[i]);
    if (n > 0 && max_token >= vocab_size) {
      return InvalidArgumentError(what + " shard " + data.shard_path(s) + " has token id " +
                                  std::to_string(max_token) + ", but model.vocab_size is " +
                                  std::to_string(vocab_size));
    }
  }
  return OkStatus();
}

v1::CheckpointModelConfig ToProto(const GptConfig& c) {
  v1::CheckpointModelConfig p;
  p.set_max_seq_len(c.max_seq_len);
  p.set_vocab_size(c.vocab_size);
  p.set_padded_vocab_size(c.padded_vocab_size);
  p.set_num_layers(c.num_layers);
  p.set_num_heads(c.num_heads);
  p.set_channels(c.channels);
  return p;
}

GptConfig FromProto(const v1::CheckpointModelConfig& p) {
  GptConfig c;
  c.max_seq_len = p.max_seq_len();
  c.vocab_size = p.vocab_size();
  c.padded_vocab_size = p.padded_vocab_size();
  c.num_layers = p.num_layers();
  c.num_heads = p.num_heads();
  c.channels = p.channels();
  return c;
}

std::string DescribeConfig(const GptConfig& c) {
  return "L=" + std::to_string(c.num_layers) + " NH=" + std::to_string(c.num_heads) +
         " C=" + std::to_string(c.channels) + " maxT=" + std::to_string(c.max_seq_len) +
         " V=" + std::to_string(c.vocab_size);
}

}  // namespace

std::string OutputDirOf(const JobSpec& spec) {
  return spec.output_dir.empty() ? "runs/" + spec.name : spec.output_dir;
}

std::string CheckpointDirOf(const JobSpec& spec) {
  return spec.checkpoint.dir.empty() ? OutputDirOf(spec) + "/ckpt" : spec.checkpoint.dir;
}

Trainer::Trainer(const TrainerOptions& options) : options_(options) {}

Trainer::~Trainer() = default;

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  std::unique_ptr<Trainer> trainer(new Trainer(options));
  RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

Status Trainer::Init() {
  const JobSpec& spec = options_.spec;
  if (options_.world_size > 1) {
    return FailedPreconditionError(
        "world size " + std::to_string(options_.world_size) +
        " asked for, but data parallelism is not built yet: run with world size 1");
  }
  RETURN_IF_ERROR(spec.Validate());
  RETURN_IF_ERROR(spec.ValidateForWorldSize(1));
  if (spec.precision.dtype != "fp32") {
    return InvalidArgumentError("precision.dtype: '" + spec.precision.dtype +
                                "' is not supported by the CPU engine; use fp32");
  }
  if (spec.resources.device != "cpu") {
    return InvalidArgumentError("resources.device: '" + spec.resources.device +
                                "' is not built yet; use cpu");
  }
  B_ = spec.train.micro_batch;
  T_ = spec.train.seq_len;
  accum_ = spec.train.global_batch / spec.train.micro_batch;
  output_dir_ = OutputDirOf(spec);
  ckpt_dir_ = CheckpointDirOf(spec);
  inputs_.resize(static_cast<size_t>(B_) * T_);
  targets_.resize(static_cast<size_t>(B_) * T_);

  RETURN_IF_ERROR(InitModel());
  const GptConfig& cfg = model_->config();
  if (T_ > cfg.max_seq_len) {
    return InvalidArgumentError("train.seq_len " + std::to_string(T_) +
                                " exceeds the model's block size " +
                                std::to_string(cfg.max_seq_len));
  }
  AdamWConfig adam{static_cast<float>(spec.train.beta1), static_cast<float>(spec.train.beta2),
                   static_cast<float>(spec.train.eps), static_cast<float>(spec.train.weight_decay)};
  optimizer_ = std::make_unique<AdamW>(model_->tensors(), model_->num_params(), adam);
  RETURN_IF_ERROR(OpenData());

  if (options_.resume) {
    Status restored = RestoreLatest();
    if (!restored.ok() && restored.code() != StatusCode::kNotFound) return restored;
  }
  writer_ = std::make_unique<ckpt::AsyncCheckpointWriter>(
      ckpt_dir_, spec.checkpoint.keep_last,
      [this](const v1::CheckpointManifest& meta, const std::string& path) {
        OnCheckpointComplete(meta, path);
      });
  RETURN_IF_ERROR(metrics_.Open(output_dir_ + "/metrics.jsonl"));
  spdlog::info("model {} ({} parameters), B={} T={} accum={} steps={}, resuming from {}",
               DescribeConfig(cfg), model_->num_params(), B_, T_, accum_, spec.train.steps,
               resumed_from_ >= 0 ? "step " + std::to_string(resumed_from_) : "scratch");
  return OkStatus();
}

Status Trainer::InitModel() {
  const JobSpec& spec = options_.spec;
  if (spec.train.init_from.empty()) {
    GptConfig cfg = GptConfig::FromSpec(spec.model);
    RETURN_IF_ERROR(cfg.Validate());
    model_ = std::make_unique<Gpt>(cfg);
    model_->InitRandom(spec.train.seed);
    return OkStatus();
  }
  auto loaded = LoadModelFile(spec.train.init_from);
  if (!loaded.ok()) return loaded.status().WithContext("train.init_from");
  model_ = std::move(loaded).value();
  const GptConfig& c = model_->config();
  const ModelSpec& m = spec.model;
  if (c.num_layers != m.n_layer || c.num_heads != m.n_head || c.channels != m.n_embd ||
      c.vocab_size != m.vocab_size || c.max_seq_len != m.block_size) {
    spdlog::warn("train.init_from {} has shapes {}; they replace the spec's model section",
                 spec.train.init_from, DescribeConfig(c));
  }
  return OkStatus();
}

Status Trainer::OpenData() {
  const JobSpec& spec = options_.spec;
  const int V = model_->config().vocab_size;
  auto train = TokenDataset::Open(spec.data.train, T_);
  if (!train.ok()) return train.status().WithContext("data.train");
  train_data_ = std::shared_ptr<const TokenDataset>(std::move(train).value());
  RETURN_IF_ERROR(CheckTokenRange(*train_data_, V, "data.train"));
  DataLoaderOptions lo;
  lo.layout = BatchLayout{spec.train.global_batch, B_, 0, 1};
  lo.seed = spec.train.seed;
  lo.shuffle = true;
  lo.prefetch = options_.prefetch;
  auto loader = DataLoader::Create(train_data_, lo);
  if (!loader.ok()) return loader.status().WithContext("data.train");
  loader_ = std::move(loader).value();

  if (spec.data.val.empty() || spec.train.eval_every <= 0) return OkStatus();
  auto val = TokenDataset::Open(spec.data.val, T_);
  if (!val.ok()) return val.status().WithContext("data.val");
  val_data_ = std::shared_ptr<const TokenDataset>(std::move(val).value());
  RETURN_IF_ERROR(CheckTokenRange(*val_data_, V, "data.val"));
  auto eval = EvalLoader::Create(val_data_, B_, T_);
  if (!eval.ok()) return eval.status().WithContext("data.val");
  val_loader_ = std::move(eval).value();
  return OkStatus();
}

Status Trainer::RestoreLatest() {
  std::string path;
  auto snap = ckpt::LoadLatestCheckpoint(ckpt_dir_, &path);
  if (!snap.ok()) return snap.status();
  const v1::CheckpointManifest& m = snap->meta;
  const GptConfig saved = FromProto(m.model());
  if (!(saved == model_->config())) {
    return InvalidArgumentError("checkpoint " + path + " holds a model " + DescribeConfig(saved) +
                                ", the job spec asks for " + DescribeConfig(model_->config()) +
                                "; use another checkpoint.dir (or `drover train --fresh`)");
  }
  const size_t n = model_->num_params();
  if (snap->params.size() != n) {
    return DataLossError("checkpoint " + path + " has " + std::to_string(snap->params.size()) +
                         " parameters, the model has " + std::to_string(n));
  }
  std::copy(snap->params.begin(), snap->params.end(), model_->params());
  std::copy(snap->adam_m.begin(), snap->adam_m.end(), optimizer_->m());
  std::copy(snap->adam_v.begin(), snap->adam_v.end(), optimizer_->v());
  optimizer_->set_step_count(m.optimizer_step());
  SamplerState s;
  s.epoch = static_cast<uint64_t>(m.train_sampler().epoch());
  s.offset = static_cast<uint64_t>(m.train_sampler().offset());
  s.consumed_samples = static_cast<uint64_t>(m.train_sampler().consumed_samples());
  Status st = loader_->Restore(s);
  if (!st.ok()) return st.WithContext("checkpoint " + path + " sampler position");
  step_ = m.step();
  resumed_from_ = m.step();
  last_checkpoint_step_ = m.step();
  spdlog::info("resumed from checkpoint {} (step {}, {} samples consumed)", path, m.step(),
               m.consumed_samples());
  return OkStatus();
}

bool Trainer::StopRequested() const {
  return options_.stop != nullptr && options_.stop->load(std::memory_order_relaxed);
}

StatusOr<StepMetrics> Trainer::Step() {
  const auto t0 = Clock::now();
  const size_t n = model_->num_params();
  model_->ZeroGrad();
  double loss_sum = 0;
  double wait_s = 0;
  for (int a = 0; a < accum_; ++a) {
    if (StopRequested()) return CancelledError("stopped during step " + std::to_string(step_ + 1));
    loader_->Next(inputs_.data(), targets_.data());
    wait_s += loader_->last_wait_s();
    loss_sum += model_->Forward(inputs_.data(), targets_.data(), B_, T_);
    model_->Backward(1.0f / static_cast<float>(accum_));
  }
  const double lr = LearningRate(options_.spec.train, step_);
  const double norm = ClipGradNorm(model_->grads(), n, options_.spec.train.grad_clip);
  optimizer_->Step(model_->params(), model_->grads(), static_cast<float>(lr));
  ++step_;

  StepMetrics m;
  m.step = step_;
  m.loss = loss_sum / accum_;
  m.lr = lr;
  m.grad_norm = norm;
  m.step_ms = MsSince(t0);
  m.tokens_per_s = static_cast<double>(accum_) * B_ * T_ / (m.step_ms / 1000.0);
  m.data_wait_ms = wait_s * 1000.0;
  m.world_size = options_.world_size;
  m.attempt = options_.attempt;
  if (!std::isfinite(m.loss)) {
    return InternalError("training loss is not finite at step " + std::to_string(step_));
  }
  return m;
}

StatusOr<double> Trainer::Evaluate() {
  if (val_loader_ == nullptr) return NotFoundError("no validation data (data.val)");
  const int64_t batches =
      std::min<int64_t>(options_.spec.train.eval_batches, val_loader_->num_batches());
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    val_loader_->Batch(i, inputs_.data(), targets_.data());
    sum += model_->Forward(inputs_.data(), targets_.data(), B_, T_);
  }
  return sum / static_cast<double>(std::max<int64_t>(batches, 1));
}

Status Trainer::SaveCheckpoint(bool async) {
  const JobSpec& spec = options_.spec;
  const size_t n = model_->num_params();
  ckpt::CheckpointSnapshot snap;
  v1::CheckpointManifest& m = snap.meta;
  m.set_job_id(options_.job_id);
  m.set_attempt(options_.attempt);
  m.set_step(step_);
  const SamplerState s = loader_->state();
  m.set_consumed_samples(static_cast<int64_t>(s.consumed_samples));
  m.mutable_train_sampler()->set_epoch(static_cast<int64_t>(s.epoch));
  m.mutable_train_sampler()->set_offset(static_cast<int64_t>(s.offset));
  m.mutable_train_sampler()->set_consumed_samples(static_cast<int64_t>(s.consumed_samples));
  *m.mutable_model() = ToProto(model_->config());
  for (const TensorInfo& t : model_->tensors()) {
    v1::CheckpointTensor* pt = m.add_tensors();
    pt->set_name(t.name);
    pt->set_offset(static_cast<int64_t>(t.offset));
    pt->set_numel(static_cast<int64_t>(t.numel));
    for (int64_t d : t.shape) pt->add_shape(d);
    pt->set_decay(t.decay);
  }
  // The engine has no stochastic op (no dropout), so the seed is the whole RNG state.
  m.set_rng_state(spec.train.seed);
  m.mutable_loss_scaler()->set_scale(1.0);  // fp32: no loss scaling
  m.set_world_size(options_.world_size);
  m.set_optimizer_step(optimizer_->step_count());
  m.set_created_ms(WallNowMs());
  m.set_num_params(static_cast<int64_t>(n));
  snap.params.assign(model_->params(), model_->params() + n);
  snap.adam_m.assign(optimizer_->m(), optimizer_->m() + n);
  snap.adam_v.assign(optimizer_->v(), optimizer_->v() + n);
  last_checkpoint_step_ = step_;
  if (async) return writer_->Submit(std::move(snap));
  return writer_->WriteNow(snap);
}

Status Trainer::FlushCheckpoints() { return writer_->Flush(); }

Status Trainer::SaveModel(const std::string& path) const { return SaveModelFile(*model_, path); }

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

void Trainer::LogStep(const StepMetrics& m) const {
  const int64_t every = std::max<int64_t>(options_.spec.train.log_every, 1);
  if (!options_.log_steps || (m.step % every != 0 && !m.val_loss.has_value())) return;
  std::string val = m.val_loss.has_value() ? fmt::format(" | val {:.4f}", *m.val_loss) : "";
  spdlog::info(
      "step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | "
      "{:.1f} ms | wait {:.2f} ms",
      m.step, options_.spec.train.steps, m.loss, val, m.lr, m.grad_norm, m.tokens_per_s, m.step_ms,
      m.data_wait_ms);
}

Status Trainer::Run() {
  const JobSpec& spec = options_.spec;
  const int64_t every_ckpt = spec.checkpoint.every_steps;
  while (step_ < spec.train.steps) {
    auto m = Step();
    if (!m.ok()) {
      // A checkpoint already snapshotted is worth finishing; the step in progress is not.
      (void)writer_->Flush();
      return m.status();
    }
    if (spec.train.eval_every > 0 && val_loader_ != nullptr &&
        (step_ % spec.train.eval_every == 0 || step_ == spec.train.steps)) {
      auto val = Evaluate();
      if (!val.ok()) return val.status();
      m->val_loss = *val;
    }
    LogStep(*m);
    RETURN_IF_ERROR(metrics_.Append(*m));
    if (options_.listener != nullptr) options_.listener->OnStep(*m);
    if (every_ckpt > 0 && step_ % every_ckpt == 0 && step_ < spec.train.steps) {
      Status st = SaveCheckpoint(spec.checkpoint.async);
      if (!st.ok()) spdlog::warn("an earlier checkpoint failed: {}", st.ToString());
    }
  }
  if (every_ckpt > 0 && last_checkpoint_step_ != step_) {
    RETURN_IF_ERROR(SaveCheckpoint(/*async=*/false));
  }
  RETURN_IF_ERROR(writer_->Flush());
  const std::string model_path = output_dir_ + "/model.bin";
  RETURN_IF_ERROR(SaveModel(model_path));
  spdlog::info("training done at step {}; model written to {}", step_, model_path);
  if (options_.listener != nullptr) options_.listener->OnDone();
  return OkStatus();
}

}  // namespace drover::engine
