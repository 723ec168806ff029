#include "worker/engine/trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>

#include "common/yaml_util.h"
#include "worker/engine/kernels/cuda_backend.h"
#include "worker/engine/model/gpt.h"
#include "worker/engine/model/gpt_flops.h"
#include "worker/engine/model/model_file.h"
#include "worker/engine/optim/lr_schedule.h"
#include "worker/engine/parallel/cuda_groups.h"
#include "worker/engine/parallel/peer_check.h"
#include "worker/engine/parallel/pipeline.h"
#include "worker/engine/parallel/staged_communicator.h"

namespace drover::engine {
namespace {

using Clock = std::chrono::steady_clock;

// How long the run's end waits to confirm its attempt (rides through a coordinator restart).
constexpr std::chrono::milliseconds kConfirmTimeout{5000};

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// precision.loss_scale: "dynamic" (the scaler's defaults), or a fixed scale that still
// skips steps whose gradients overflowed.
StatusOr<LossScalerConfig> LossScalerConfigOf(const PrecisionSpec& p) {
  LossScalerConfig config;
  config.initial_scale = static_cast<float>(p.initial_loss_scale);
  config.growth_interval = p.loss_scale_window;
  if (p.loss_scale == "dynamic") return config;
  double scale = 0;
  if (!yaml_util::ParseDouble(p.loss_scale, &scale) || !(scale > 0) || scale > 3.0e38) {
    return InvalidArgumentError("precision.loss_scale: '" + p.loss_scale +
                                "' is not 'dynamic' or a positive number");
  }
  config.dynamic = false;
  config.initial_scale = static_cast<float>(scale);
  config.min_scale = std::min(config.min_scale, config.initial_scale);
  return config;
}

std::string DescribePrecision(const JobSpec& spec) {
  const std::string& dtype = spec.precision.dtype;
  if (dtype == "fp32") return "fp32";
  std::string d = dtype + " compute, fp32 master weights, gradients and AdamW state";
  if (dtype == "fp16") d += ", loss scale " + spec.precision.loss_scale;
  // The CPU has no bf16/fp16 arithmetic worth using: it rounds every stored value instead,
  // but for the residual stream, which both tables keep in fp32 (GptStage).
  if (spec.resources.device == "cpu") d += " (emulated on the CPU: values rounded at each op)";
  // The CUDA table keeps what passes between ops in 16 bits (Ops::OperandFloats), the
  // residual stream and its gradient in fp32 floats.
  if (spec.resources.device == "cuda") d += " (16-bit activations, fp32 residual stream)";
  return d;
}

// What train.recompute asks, for the start-up line ("" for none).
std::string DescribeRecompute(const JobSpec& spec, const GptLayout& layout) {
  const int n = spec.train.recompute;
  if (n == 0) return "";
  if (n == TrainSpec::kRecomputeAll) return ", every layer's activations recomputed in backward";
  return ", the activations of each " + std::string(layout.chunks() > 1 ? "model chunk" : "stage") +
         "'s first " + std::to_string(n) + " layers recomputed in backward";
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

StatusOr<Ops*> OpsForDevice(const std::string& device) {
  if (device == "cpu") return CpuOps();
  if (device == "cuda") {
    StatusOr<Ops*> ops = CudaOps();
    if (!ops.ok()) return ops.status().WithContext("resources.device cuda");
    return ops;
  }
  return InvalidArgumentError("resources.device: '" + device +
                              "' is not a device; use cpu or cuda");
}

Status Trainer::Init() {
  const JobSpec& spec = options_.spec;
  RETURN_IF_ERROR(spec.Validate());
  ASSIGN_OR_RETURN(mesh_, ParallelMesh::Create(spec, options_.world_size));
  if (options_.rank < 0 || options_.rank >= options_.world_size) {
    return InvalidArgumentError("rank " + std::to_string(options_.rank) +
                                " is outside world size " + std::to_string(options_.world_size));
  }
  if (options_.world_size > 1 && options_.store == nullptr) {
    return InvalidArgumentError("world size " + std::to_string(options_.world_size) +
                                " needs a rendezvous store to connect the ranks");
  }
  Ops* ops = options_.ops;
  if (ops == nullptr) {
    ASSIGN_OR_RETURN(ops, OpsForDevice(spec.resources.device));
  }
  ops_ = ops;
  B_ = spec.train.micro_batch;
  T_ = spec.train.seq_len;
  output_dir_ = OutputDirOf(spec);
  ckpt_dir_ = CheckpointDirOf(spec);

  ASSIGN_OR_RETURN(std::vector<float> params, InitialParams());
  if (T_ > config_.max_seq_len) {
    return InvalidArgumentError("train.seq_len " + std::to_string(T_) +
                                " exceeds the model's block size " +
                                std::to_string(config_.max_seq_len));
  }
  if (options_.world_size > 1) RETURN_IF_ERROR(ConnectGroups(ops));
  parallel::ParallelGptOptions mo;
  mo.config = config_;
  mo.rank = options_.rank;
  ASSIGN_OR_RETURN(mo.schedule, parallel::ParsePipelineSchedule(spec.parallel.pp_schedule));
  mo.micro_batch = B_;
  mo.seq_len = T_;
  mo.adam =
      AdamWConfig{static_cast<float>(spec.train.beta1), static_cast<float>(spec.train.beta2),
                  static_cast<float>(spec.train.eps), static_cast<float>(spec.train.weight_decay)};
  mo.grad_clip = spec.train.grad_clip;
  mo.bucket_floats = static_cast<size_t>(spec.parallel.bucket_mb * (1 << 20) / sizeof(float));
  ASSIGN_OR_RETURN(mo.precision, ParsePrecision(spec.precision.dtype));
  ASSIGN_OR_RETURN(mo.loss_scaler, LossScalerConfigOf(spec.precision));
  mo.recompute = spec.train.recompute;  // kRecomputeAll (-1) is the engine's "all"
  ASSIGN_OR_RETURN(model_, parallel::ParallelGpt::Create(mo, *mesh_, &groups_, ops));
  model_->LoadGlobalParams(params.data());
  params = {};
  RETURN_IF_ERROR(OpenData());

  if (options_.resume) {
    Status restored = RestoreLatest();
    if (!restored.ok() && restored.code() != StatusCode::kNotFound) return restored;
  }
  // Every rank writes the shard of the checkpoint it owns; rank 0 commits.
  ckpt::AsyncCheckpointWriter::Options wo;
  wo.dir = ckpt_dir_;
  wo.rank = options_.rank;
  wo.world_size = options_.world_size;
  wo.keep_last = spec.checkpoint.keep_last;
  if (options_.world_size > 1) {
    exchange_ = std::make_unique<ckpt::KvShardExchange>(
        options_.store, options_.checkpoint_collect_timeout, options_.stop);
    // Before any rank reports a shard, so that a coordinator restart that loses a report of
    // the first checkpoint is noticed too (ShardExchange::MarkStore).
    if (is_rank0()) (void)exchange_->MarkStore();
    wo.exchange = exchange_.get();
  }
  wo.fence = options_.fence;
  wo.stop = options_.stop;
  // The final checkpoint, a drain's or a synchronous save's keeps the training thread waiting
  // while it is written: a large one on slow storage could outlast the hang timeout.
  wo.on_progress = [this](int64_t step, int64_t written, int64_t total) {
    ReportWork(written == 0, [&] {
      return fmt::format("saving checkpoint step {}: {:.1f} of {:.1f} MB written", step,
                         written / 1e6, total / 1e6);
    });
  };
  wo.on_complete = [this](const v1::CheckpointManifest& meta, const std::string& path) {
    OnCheckpointComplete(meta, path);
  };
  wo.on_failure = [this](int64_t step, const Status& error) {
    if (options_.listener != nullptr) options_.listener->OnCheckpointFailed(step, error);
  };
  writer_ = std::make_unique<ckpt::AsyncCheckpointWriter>(std::move(wo));
  if (spec.fault_tolerance.spike_rollback.enabled) {
    spike_ = std::make_unique<SpikeDetector>(spec.fault_tolerance.spike_rollback);
  }
  if (is_rank0()) RETURN_IF_ERROR(metrics_.Open(output_dir_ + "/metrics.jsonl"));
  last_checkpoint_ms_ = Now();  // checkpoint.every_minutes counts from the attempt's start
  // Ranks reach here after start-up work of different lengths (data scans, checkpoint
  // reads); the first collective of the first step must not count that against its
  // deadline.
  RETURN_IF_ERROR(StoreBarrier("ready"));
  spdlog::info(
      "model {} ({} parameters, {} on this rank), {}, {}{}, B={} T={} steps={}, resuming "
      "from {}",
      DescribeConfig(config_), GptNumParams(config_), model_->layout().num_params(),
      mesh_->Describe(), DescribePrecision(spec), DescribeRecompute(spec, model_->layout()), B_, T_,
      spec.train.steps, resumed_from_ >= 0 ? "step " + std::to_string(resumed_from_) : "scratch");
  // (Not for interleaved chunks: the head then sits on one of pp x chunks virtual stages.)
  if (is_rank0() && mesh_->pp() > 1 && mesh_->pp_chunks() == 1 && mesh_->pp_layers().empty()) {
    SuggestStageLayers();
  }
  return OkStatus();
}

void Trainer::SuggestStageLayers() const {
  const std::vector<int> balanced = parallel::BalancedStageLayers(
      config_.num_layers, config_.channels, config_.vocab_size, T_, mesh_->pp());
  if (balanced == std::vector<int>(mesh_->pp(), config_.num_layers / mesh_->pp())) return;
  std::string list;
  for (int n : balanced) {
    if (!list.empty()) list += ", ";
    list += std::to_string(n);
  }
  spdlog::info(
      "pipeline: the last stage also computes the LM head, so with {} layers each the earlier "
      "stages wait for it; parallel.pp_layers: [{}] balances the stages' compute (and holds "
      "more activations on the first)",
      config_.num_layers / mesh_->pp(), list);
}

Status Trainer::CheckPeers() {
  parallel::PeerCheckOptions check;
  check.bind_address = options_.bind_address;
  check.arrival_timeout = options_.connect_timeout;
  // A healthy peer accepts in milliseconds; the collectives' deadline is the longest wait
  // the job tolerates from a peer.
  check.probe_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options_.spec.parallel.timeout_s * 1000));
  ASSIGN_OR_RETURN(const parallel::PeerCheckResult found,
                   parallel::CheckPeers(options_.store, options_.rank, options_.world_size, check));
  const std::vector<int> cut = parallel::CutOffRanks(found.unreachable);
  if (cut.empty()) return OkStatus();
  if (options_.listener != nullptr) options_.listener->OnPeersCutOff(cut);
  std::string ranks;
  for (int r : cut) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return UnavailableError(
      "the ranks cannot all reach each other: " + parallel::DescribeReachability(found) +
      "; cut off: rank" + (cut.size() > 1 ? "s " : " ") + ranks);
}

Status Trainer::ConnectGroups(Ops* ops) {
  const JobSpec& spec = options_.spec;
  // Before the groups: a rank cut off from its peers would make their connect wait out the
  // start-up deadline, and the failure name whichever rank gave up first.
  RETURN_IF_ERROR(CheckPeers().WithContext("peer check"));
  parallel::ConnectOptions connect;
  connect.bind_address = options_.bind_address;
  connect.connect_timeout = options_.connect_timeout;
  connect.comm.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(spec.parallel.timeout_s * 1000));
  parallel::BackendChoice choice{false, "resources.device " + spec.resources.device};
  if (spec.resources.device == "cuda") {
    ASSIGN_OR_RETURN(parallel::CudaDevice mine, parallel::LocalCudaDevice());
    ASSIGN_OR_RETURN(
        std::vector<parallel::CudaDevice> devices,
        parallel::ExchangeCudaDevices(options_.store, options_.rank, options_.world_size, mine,
                                      options_.connect_timeout));
    ASSIGN_OR_RETURN(choice, parallel::ChooseNccl(spec.parallel.backend, devices));
  }
  // NCCL: device buffers go to NCCL as they are, the engine's host scalars are staged.
  // Gloo moves host memory: device arenas are staged through the host (a no-op on CPU).
  parallel::GroupConnector connect_one;
  std::shared_ptr<parallel::GlooTransport> transport;
  if (choice.nccl) {
    connect_one =
        [&](const std::string& name, int rank, int size,
            parallel::GroupCaller caller) -> StatusOr<std::unique_ptr<parallel::Communicator>> {
      // The training thread's groups let the host run ahead of their transfers.
      parallel::CommOptions options = connect.comm;
      options.stream_ordered =
          spec.parallel.stream_order && caller == parallel::GroupCaller::kTrainingThread;
      ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                       parallel::ConnectNcclThroughPlugin(ops, options_.store, name, rank, size,
                                                          options, connect.connect_timeout));
      return parallel::StageThroughDevice(std::move(comm), ops);
    };
  } else {
    ASSIGN_OR_RETURN(transport, parallel::GlooTransport::Create(connect.bind_address));
    connect_one = [&](const std::string& name, int rank, int size,
                      parallel::GroupCaller) -> StatusOr<std::unique_ptr<parallel::Communicator>> {
      ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> comm,
                       parallel::ConnectGlooGroup(transport, options_.store, name, rank, size,
                                                  connect.comm, connect.connect_timeout));
      return parallel::StageThroughHost(std::move(comm), ops);
    };
  }
  StatusOr<parallel::ProcessGroups> groups =
      parallel::ConnectProcessGroups(*mesh_, options_.rank, connect_one);
  if (!groups.ok()) return groups.status().WithContext("connecting the ranks");
  groups_ = std::move(groups).value();
  if (is_rank0()) {
    spdlog::info("ranks connected through {} ({})", choice.nccl ? "NCCL" : "Gloo", choice.reason);
  }
  return OkStatus();
}

StatusOr<std::vector<float>> Trainer::InitialParams() {
  const JobSpec& spec = options_.spec;
  if (spec.train.init_from.empty()) {
    config_ = GptConfig::FromSpec(spec.model);
    RETURN_IF_ERROR(config_.Validate());
    std::vector<float> params(GptNumParams(config_));
    InitGptParams(config_, spec.train.seed, params.data());
    return params;
  }
  auto loaded = LoadModelFile(spec.train.init_from);
  if (!loaded.ok()) return loaded.status().WithContext("train.init_from");
  const Gpt& model = **loaded;
  config_ = model.config();
  const ModelSpec& m = spec.model;
  if (config_.num_layers != m.n_layer || config_.num_heads != m.n_head ||
      config_.channels != m.n_embd || config_.vocab_size != m.vocab_size ||
      config_.max_seq_len != m.block_size) {
    spdlog::warn("train.init_from {} has shapes {}; they replace the spec's model section",
                 spec.train.init_from, DescribeConfig(config_));
    // The mesh was validated against the spec's shapes; the file's must fit it too.
    if (!StageLayers(config_.num_layers, mesh_->pp(), mesh_->pp_layers(), mesh_->pp_chunks())
             .ok() ||
        config_.num_heads % mesh_->tp() != 0) {
      return InvalidArgumentError("train.init_from " + spec.train.init_from + " has " +
                                  DescribeConfig(config_) + ", which does not split into pp " +
                                  std::to_string(mesh_->pp()) + " x tp " +
                                  std::to_string(mesh_->tp()));
    }
  }
  return std::vector<float>(model.params(), model.params() + model.num_params());
}

namespace {

// A data file that is not a token shard (wrong magic, truncated) is DataLoss to the shard
// reader, but to the trainer it is the spec's input: another attempt would read the same
// file, so it exits with the code for input the user must fix (trainer_process.h), not one
// that the coordinator retries.
Status AsInputError(const Status& st, const std::string& field) {
  if (st.code() == StatusCode::kDataLoss) return InvalidArgumentError(field + ": " + st.message());
  return st.WithContext(field);
}

}  // namespace

Status Trainer::OpenData() {
  const JobSpec& spec = options_.spec;
  const int V = config_.vocab_size;
  auto train = TokenDataset::Open(spec.data.train, T_);
  if (!train.ok()) return AsInputError(train.status(), "data.train");
  train_data_ = std::shared_ptr<const TokenDataset>(std::move(train).value());
  DataLoaderOptions lo;
  const ParallelMesh::Coord c = mesh_->CoordOf(options_.rank);
  lo.layout = BatchLayout{spec.train.global_batch, B_, c.dp, mesh_->dp()};
  lo.seed = spec.train.seed;
  lo.shuffle = true;
  lo.prefetch = options_.prefetch;
  // Token ids are checked batch by batch as they are read (a bad one fails the step that
  // reaches it, naming shard and position), not by a scan of the whole data at start-up.
  lo.vocab_size = V;
  auto loader = DataLoader::Create(train_data_, lo);
  if (!loader.ok()) return loader.status().WithContext("data.train");
  loader_ = std::move(loader).value();

  if (spec.train.eval_every <= 0) return OkStatus();
  if (!spec.data.hellaswag.empty()) {
    auto examples = ReadChoiceFile(spec.data.hellaswag, spec.train.hellaswag_examples);
    if (!examples.ok()) return AsInputError(examples.status(), "data.hellaswag");
    auto batches = ChoiceBatches::Create(std::move(examples).value(), B_, T_, V);
    if (!batches.ok()) return AsInputError(batches.status(), "data.hellaswag");
    hellaswag_ = std::move(batches).value();
    if (is_rank0()) {
      spdlog::info("data.hellaswag: {} examples, {} endings in rows of {} positions, {} a batch",
                   hellaswag_->num_examples(), hellaswag_->sums().size(), hellaswag_->row_length(),
                   hellaswag_->rows_per_batch());
    }
  }
  if (spec.data.val.empty()) return OkStatus();
  auto val = TokenDataset::Open(spec.data.val, T_);
  if (!val.ok()) return AsInputError(val.status(), "data.val");
  val_data_ = std::shared_ptr<const TokenDataset>(std::move(val).value());
  auto eval = EvalLoader::Create(val_data_, B_, T_, V);
  if (!eval.ok()) return eval.status().WithContext("data.val");
  val_loader_ = std::move(eval).value();
  return OkStatus();
}

Status Trainer::StoreBarrier(const std::string& name) {
  if (options_.world_size == 1) return OkStatus();
  const std::string prefix = "barrier/" + name + "/";
  RETURN_IF_ERROR(options_.store->Set(prefix + std::to_string(options_.rank), "1"));
  for (int r = 0; r < options_.world_size; ++r) {
    auto got = options_.store->Get(prefix + std::to_string(r), options_.connect_timeout);
    if (!got.ok()) return got.status().WithContext("waiting for rank " + std::to_string(r));
  }
  return OkStatus();
}

bool Trainer::TakeCheckpointRequest() {
  if (!checkpoint_voted_) return false;
  checkpoint_voted_ = false;
  requests_served_ = requests_voted_;  // unchanged on a rank that did not vote
  if (!options_.spec.checkpoint.enabled()) {
    if (!warned_no_checkpoints_ && is_rank0()) {
      spdlog::warn(
          "a checkpoint was requested at step {}, but checkpoint.every_steps and "
          "checkpoint.every_minutes are 0: this job saves no checkpoints",
          step_);
    }
    warned_no_checkpoints_ = true;
    return false;
  }
  if (is_rank0() && !time_voted_) {
    spdlog::info("saving a checkpoint at step {}: requested", step_);
  } else if (is_rank0() && checkpoint_deferred_since_ < 0) {  // said once, not every deferral
    spdlog::info(
        "saving a checkpoint at step {}: {:.1f} minutes since the last (checkpoint.every_minutes "
        "{:g})",
        step_, time_voted_minutes_, options_.spec.checkpoint.every_minutes);
  }
  return true;
}

int64_t Trainer::Now() const {
  return (options_.clock != nullptr ? options_.clock : SystemClock::Get())->NowMs();
}

bool Trainer::DrainRequested() const {
  return options_.drain != nullptr && options_.drain->load(std::memory_order_acquire);
}

bool Trainer::StopRequested() const {
  return options_.stop != nullptr && options_.stop->load(std::memory_order_relaxed);
}

StatusOr<StepMetrics> Trainer::Step() {
  const auto t0 = Clock::now();
  double wait_s = 0;
  auto next_batch = [&](int32_t* inputs, int32_t* targets) -> Status {
    if (StopRequested()) return CancelledError("stopped during step " + std::to_string(step_ + 1));
    Status st = loader_->Next(inputs, targets);
    wait_s += loader_->last_wait_s();
    return st.WithContext("data.train");
  };
  const double lr = LearningRate(options_.spec.train, step_);
  const uint64_t allocations = ops_->device_allocations();
  // The drain before the requests: a drain seen here has its request counted already.
  const bool draining = DrainRequested();
  const uint64_t requests = options_.checkpoint_requests != nullptr
                                ? options_.checkpoint_requests->load(std::memory_order_relaxed)
                                : 0;
  parallel::StepVotes votes;
  // Rank 0 keeps the time since the last checkpoint (one clock, so the log says why); once
  // checkpoint.every_minutes is over it votes at the start of a step, and every rank saves
  // that step, as for a request.
  const double every_ms = options_.spec.checkpoint.every_minutes * 60'000.0;
  const int64_t since_ms = Now() - last_checkpoint_ms_;
  time_voted_ = is_rank0() && every_ms > 0 && since_ms >= every_ms;
  if (time_voted_) time_voted_minutes_ = since_ms / 60'000.0;
  votes.checkpoint = requests != requests_served_ || time_voted_;
  if (draining) drain_voted_ = true;
  if (writer_ != nullptr) {
    const std::optional<std::chrono::milliseconds> saving = writer_->InFlightFor();
    votes.checkpoint_busy = saving.has_value() && (*saving >= options_.checkpoint_defer_after ||
                                                   writer_->WaitingOnCoordinator());
  }
  if (!last_step_end_.has_value()) {
    last_step_end_ = t0;
    last_step_waited_s_ = parallel::WaitSeconds(groups_);
  }
  ASSIGN_OR_RETURN(parallel::StepResult r, model_->Step(next_batch, lr, votes));
  ++step_;
  if (votes.checkpoint) requests_voted_ = requests;
  checkpoint_voted_ = r.checkpoint_voted;
  checkpoint_busy_ = r.checkpoint_busy;

  StepMetrics m;
  m.step = step_;
  m.loss = r.loss;
  m.lr = lr;
  m.grad_norm = r.grad_norm;
  m.step_ms = SecondsSince(t0) * 1000.0;
  m.tokens_per_s =
      static_cast<double>(options_.spec.train.global_batch) * T_ / (m.step_ms / 1000.0);
  if (options_.peak_tflops > 0) {
    m.mfu = ModelFlopsPerToken(options_.spec.model, T_) * m.tokens_per_s /
            (options_.world_size * options_.peak_tflops * 1e12);
  }
  m.data_wait_ms = wait_s * 1000.0;
  m.world_size = options_.world_size;
  m.attempt = options_.attempt;
  m.dp = mesh_->dp();
  m.pp = mesh_->pp();
  m.tp = mesh_->tp();
  m.pp_chunks = mesh_->pp_chunks();
  m.zero_stage = mesh_->zero_stage();
  m.dp_shard = mesh_->dp_shard();
  m.comm_ms = r.comm_busy_s * 1000.0;
  m.comm_wait_ms = r.comm_blocked_s * 1000.0;
  m.publish_ms = r.publish_s * 1000.0;
  m.pp_wait_ms = r.pp_wait_s * 1000.0;
  const auto end = Clock::now();
  const double waited_s = parallel::WaitSeconds(groups_);
  m.peer_wait_ms = (waited_s - last_step_waited_s_ + r.comm_overlapped_waits_s) * 1000.0;
  m.busy_ms =
      std::max(0.0, std::chrono::duration<double, std::milli>(end - *last_step_end_).count() -
                        m.peer_wait_ms);
  m.pp_stage = mesh_->CoordOf(options_.rank).pp;
  last_step_end_ = end;
  last_step_waited_s_ = waited_s;
  constexpr double kMiB = 1 << 20;
  m.param_mib = static_cast<double>(r.param_bytes) / kMiB;
  m.grad_mib = static_cast<double>(r.grad_bytes) / kMiB;
  m.optimizer_mib = static_cast<double>(r.optimizer_bytes) / kMiB;
  m.working_mib = static_cast<double>(r.working_bytes) / kMiB;
  m.activation_mib = static_cast<double>(r.activation_bytes) / kMiB;
  m.rollbacks = rollbacks_;
  if (model_->loss_scaler_state() != nullptr) m.loss_scale = r.loss_scale;
  m.skipped = r.skipped;
  if (options_.spec.resources.device != "cpu") {
    m.device_allocations = static_cast<int64_t>(ops_->device_allocations() - allocations);
    const Ops::DeviceBytesHeld held = ops_->device_bytes();
    m.device_mib = static_cast<double>(held.now) / kMiB;
    m.device_peak_mib = static_cast<double>(held.peak) / kMiB;
  }
  if (!std::isfinite(m.loss) && spike_ == nullptr) {
    return InternalError("training loss is not finite at step " + std::to_string(step_));
  }
  return m;
}

StatusOr<double> Trainer::Evaluate() {
  if (val_loader_ == nullptr) return NotFoundError("no validation data (data.val)");
  const int64_t batches =
      std::min<int64_t>(options_.spec.train.eval_batches, val_loader_->num_batches());
  return model_->Evaluate(batches, [this, batches](int64_t i, int32_t* inputs, int32_t* targets) {
    ReportWork(i == 0,
               [&] { return fmt::format("evaluating data.val: batch {} of {}", i + 1, batches); });
    return val_loader_->Batch(i, inputs, targets).WithContext("data.val");
  });
}

void Trainer::ReportWork(bool first, const std::function<std::string()>& describe) {
  if (options_.listener == nullptr) return;
  MutexLock lock(&work_mu_);
  const auto now = std::chrono::steady_clock::now();
  if (!first && now - last_work_report_ < std::chrono::duration<double>(kWorkReportSeconds)) {
    return;
  }
  last_work_report_ = now;
  options_.listener->OnWork(describe());
}

StatusOr<ChoiceAccuracy> Trainer::EvaluateHellaswag() {
  if (hellaswag_ == nullptr) {
    return FailedPreconditionError("no data.hellaswag to evaluate (or train.eval_every is 0)");
  }
  hellaswag_->Reset();
  RETURN_IF_ERROR(
      model_
          ->Evaluate(
              hellaswag_->num_batches(),
              [this](int64_t i, int32_t* inputs, int32_t* targets) {
                ReportWork(i == 0, [&] {
                  return fmt::format("evaluating data.hellaswag: batch {} of {}", i + 1,
                                     hellaswag_->num_batches());
                });
                hellaswag_->Batch(i, inputs, targets);
                return OkStatus();
              },
              [this](int64_t i, const float* losses) { hellaswag_->AddLosses(i, losses); },
              hellaswag_->row_length())
          .status());
  std::vector<double>& sums = hellaswag_->sums();
  RETURN_IF_ERROR(model_->SumOverRanks(sums.data(), sums.size()));
  return hellaswag_->Accuracy();
}

const std::vector<double>& Trainer::hellaswag_losses() const {
  static const std::vector<double> kNone;
  return hellaswag_ != nullptr ? hellaswag_->sums() : kNone;
}

Status Trainer::PublishMetrics(const StepMetrics* m, bool wait) {
  if (!metrics_.is_open()) return OkStatus();
  if (m != nullptr) held_metrics_.push_back(*m);
  // A long coordinator outage must not grow the trainer without bound: the oldest held lines
  // go first (the run itself is not affected, only its record).
  constexpr size_t kMaxHeldMetrics = 100'000;
  if (held_metrics_.size() > kMaxHeldMetrics) {
    if (dropped_metrics_++ % 10'000 == 0) {
      spdlog::warn(
          "the coordinator has not confirmed this attempt for {} steps; dropping the "
          "oldest held metrics lines ({} so far)",
          held_metrics_.size(), dropped_metrics_);
    }
    held_metrics_.pop_front();
  }
  if (options_.fence != nullptr && !options_.fence->Current()) {
    if (!wait) return OkStatus();
    // The run's end: the lines of a superseded attempt are dropped (its successor writes
    // its own).
    Status st = ConfirmWithin(options_.fence, kConfirmTimeout, options_.stop);
    if (!st.ok()) {
      held_metrics_.clear();
      return st.code() == StatusCode::kFailedPrecondition ? OkStatus() : st;
    }
  }
  for (const StepMetrics& held : held_metrics_) RETURN_IF_ERROR(metrics_.Append(held));
  held_metrics_.clear();
  return OkStatus();
}

StatusOr<std::vector<float>> Trainer::GlobalParams() {
  std::vector<float> params;
  RETURN_IF_ERROR(model_->GatherGlobal(&params, nullptr, nullptr));
  return params;
}

Status Trainer::SaveModel(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<float> params, GlobalParams());
  if (!is_rank0()) return OkStatus();
  return SaveModelFile(config_, params.data(), path);
}

void Trainer::LogStep(const StepMetrics& m) const {
  const int64_t every = std::max<int64_t>(options_.spec.train.log_every, 1);
  if (!options_.log_steps || !is_rank0() ||
      (m.step % every != 0 && !m.val_loss.has_value() && !m.hellaswag.has_value())) {
    return;
  }
  std::string val = m.val_loss.has_value() ? fmt::format(" | val {:.4f}", *m.val_loss) : "";
  if (m.hellaswag.has_value()) val += fmt::format(" | hellaswag {:.4f}", *m.hellaswag);
  std::string scale;
  if (m.loss_scale.has_value()) {
    scale = fmt::format(" | scale {:g}", *m.loss_scale);
    if (m.skipped) scale += " | skipped: gradients overflowed, scale halved";
  }
  const std::string mfu = m.mfu.has_value() ? fmt::format(" | MFU {:.1f}%", *m.mfu * 100) : "";
  spdlog::info(
      "step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s{} | "
      "{:.1f} ms | wait {:.2f} ms{}",
      m.step, options_.spec.train.steps, m.loss, val, m.lr, m.grad_norm, m.tokens_per_s, mfu,
      m.step_ms, m.data_wait_ms, scale);
}

Status Trainer::Run() {
  const JobSpec& spec = options_.spec;
  const int64_t every_ckpt = spec.checkpoint.every_steps;
  while (step_ < spec.train.steps) {
    auto m = Step();
    if (!m.ok()) {
      // A checkpoint already snapshotted is worth finishing; the step in progress is not.
      (void)FlushCheckpoints();
      return PeerDrained(m.status());
    }
    if (spike_ != nullptr && spike_->Observe(m->loss)) {
      m->spike = true;
      LogStep(*m);
      RETURN_IF_ERROR(PublishMetrics(&*m, /*wait=*/false));
      RETURN_IF_ERROR(RollBack(*m));
      continue;
    }
    if (spec.train.eval_every > 0 &&
        (step_ % spec.train.eval_every == 0 || step_ == spec.train.steps)) {
      if (val_loader_ != nullptr) {
        auto val = Evaluate();
        if (!val.ok()) return val.status();
        m->val_loss = *val;
      }
      if (hellaswag_ != nullptr) {
        auto acc = EvaluateHellaswag();
        if (!acc.ok()) return acc.status();
        m->hellaswag = acc->acc_norm();
      }
    }
    LogStep(*m);
    RETURN_IF_ERROR(PublishMetrics(&*m, /*wait=*/false));
    if (options_.listener != nullptr) options_.listener->OnStep(*m);
    // Every rank reads the same votes, so all save the same step or none does.
    const bool requested = TakeCheckpointRequest();
    const bool scheduled = every_ckpt > 0 && step_ % every_ckpt == 0;
    if ((scheduled || requested || checkpoint_deferred_since_ >= 0) && step_ < spec.train.steps) {
      RETURN_IF_ERROR(SaveOrDeferCheckpoint());  // a peer is gone
    }
    // Drained: once the checkpoint voted for (or one after it, if deferred) is saved. The
    // last step ends as any run does, with its final checkpoint and model.
    if (drain_voted_ && step_ < spec.train.steps) {
      if (!spec.checkpoint.enabled()) {
        drained_ = true;
        return CancelledError("drained after step " + std::to_string(step_) +
                              " (the node is shutting down; this job saves no checkpoints)");
      }
      if (last_checkpoint_step_ == step_) return FinishDrain();
    }
  }
  // The model file's gather first: after it no rank enters a collective, so the final
  // shards are written and committed while rank 0 writes the model.
  std::vector<float> params;
  RETURN_IF_ERROR(model_->GatherGlobal(&params, nullptr, nullptr));
  if (spec.checkpoint.enabled() && last_checkpoint_step_ != step_) {
    last_checkpoint_step_ = step_;
    (void)writer_->Submit(MakeSnapshot());  // an earlier failure was reported already
  }
  Status model = OkStatus();
  const std::string model_path = output_dir_ + "/model.bin";
  // The model is the training's product: written even when the checkpoint disk failed (its
  // own disk may have room), and then the run has succeeded.
  if (is_rank0()) {
    RETURN_IF_ERROR(PublishMetrics(nullptr, /*wait=*/true));
    model = ConfirmWithin(options_.fence, kConfirmTimeout, options_.stop);
    if (model.ok()) model = SaveModelFile(config_, params.data(), model_path);
  }
  Status ckpt = writer_->Flush();
  if (!model.ok()) {
    return ckpt.ok() ? model
                     : InternalError("the final checkpoint and the model both failed: " +
                                     ckpt.ToString() + "; " + model.ToString());
  }
  if (!ckpt.ok()) spdlog::error("the final checkpoint failed: {}", ckpt.ToString());
  if (is_rank0()) {
    spdlog::info("training done at step {}; model written to {}", step_, model_path);
  } else {
    spdlog::info("training done at step {}", step_);
  }
  if (options_.listener != nullptr) options_.listener->OnDone();
  return OkStatus();
}

}  // namespace drover::engine
