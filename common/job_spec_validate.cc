// The rules a decoded JobSpec must satisfy. Each message reads
//   "<field path> (line N): <value> <problem>; <what would be valid>"
// so that a person can fix the spec without reading this file.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/job_spec_internal.h"
#include "common/parallel_mesh.h"
#include "common/yaml_util.h"

namespace drover {
namespace {

std::string Num(double v) { return yaml_util::FormatDouble(v); }
std::string Num(int64_t v) { return std::to_string(v); }

constexpr int64_t kMaxWorldSize = 1 << 16;
constexpr int64_t kMaxTimeLimitMinutes = 365 * 24 * 60;

}  // namespace

namespace spec_internal {
namespace {

// Generous upper bounds: they catch unit mistakes and int overflow in the engine's size
// arithmetic, not ambitious models.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxChannels = 1 << 16;
constexpr int64_t kMaxSeqLen = 1 << 20;
constexpr int64_t kMaxVocab = 1 << 24;
constexpr int64_t kMaxBatch = 1 << 24;
constexpr int64_t kMaxParallelDegree = 1024;
constexpr int64_t kMaxThreads = 1024;

class Rules {
 public:
  Rules(const JobSpec& spec, const SourceMap& sources) : s_(spec), src_(sources) {}

  Status Check() const {
    RETURN_IF_ERROR(CheckName());
    RETURN_IF_ERROR(CheckModel());
    RETURN_IF_ERROR(CheckData());
    RETURN_IF_ERROR(CheckTrain());
    RETURN_IF_ERROR(CheckResources());
    RETURN_IF_ERROR(CheckPrecision());
    RETURN_IF_ERROR(CheckParallel());
    RETURN_IF_ERROR(CheckCheckpoint());
    RETURN_IF_ERROR(CheckFaultTolerance());
    return CheckLayout();  // last: it assumes every single field is sane
  }

 private:
  Status Fail(const std::string& path, const std::string& problem) const {
    return InvalidArgumentError(path + src_.Where(path) + ": " + problem);
  }

  Status Between(const std::string& path, int64_t v, int64_t lo, int64_t hi) const {
    if (v >= lo && v <= hi) return OkStatus();
    return Fail(path, Num(v) + " is out of range; must be between " + Num(lo) + " and " + Num(hi));
  }
  Status AtLeast(const std::string& path, int64_t v, int64_t lo) const {
    if (v >= lo) return OkStatus();
    return Fail(path, Num(v) + " is out of range; must be at least " + Num(lo));
  }
  Status Positive(const std::string& path, double v) const {
    if (std::isfinite(v) && v > 0) return OkStatus();
    return Fail(path, Num(v) + " is out of range; must be a number greater than 0");
  }
  Status NonNegative(const std::string& path, double v) const {
    if (std::isfinite(v) && v >= 0) return OkStatus();
    return Fail(path, Num(v) + " is out of range; must be a number at least 0");
  }
  Status UnitInterval(const std::string& path, double v) const {
    if (v >= 0 && v < 1) return OkStatus();
    return Fail(path, Num(v) + " is out of range; must be in [0, 1)");
  }
  Status OneOf(const std::string& path, const std::string& v,
               std::initializer_list<const char*> valid) const {
    std::string list;
    for (const char* option : valid) {
      if (v == option) return OkStatus();
      list += (list.empty() ? "" : ", ") + std::string(option);
    }
    return Fail(path, "'" + v + "' is not valid; must be one of " + list);
  }

  Status CheckName() const {
    const std::string& name = s_.name;
    const std::string rule = "a job name uses only letters, digits, '.', '_' and '-'";
    if (name.empty()) return Fail("name", "is required; " + rule);
    if (name.size() > 128) {
      return Fail("name", "is " + Num(static_cast<int64_t>(name.size())) +
                              " characters long; must be at most 128");
    }
    for (char c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
        return Fail("name", "'" + name + "' contains '" + std::string(1, c) + "'; " + rule);
      }
    }
    // The name becomes a directory (runs/<name>): "." and ".." would escape it.
    if (name == "." || name == "..") return Fail("name", "'" + name + "' is not a valid name");
    return OkStatus();
  }

  Status CheckModel() const {
    const ModelSpec& m = s_.model;
    RETURN_IF_ERROR(Between("model.n_layer", m.n_layer, 1, kMaxLayers));
    RETURN_IF_ERROR(Between("model.n_head", m.n_head, 1, kMaxHeads));
    RETURN_IF_ERROR(Between("model.n_embd", m.n_embd, 1, kMaxChannels));
    RETURN_IF_ERROR(Between("model.block_size", m.block_size, 1, kMaxSeqLen));
    RETURN_IF_ERROR(Between("model.vocab_size", m.vocab_size, 1, kMaxVocab));
    if (m.n_embd % m.n_head != 0) {
      return Fail("model.n_embd", Num(int64_t{m.n_embd}) + " is not divisible by model.n_head (" +
                                      Num(int64_t{m.n_head}) +
                                      "); n_embd must be a multiple of n_head");
    }
    return OkStatus();
  }

  Status CheckData() const {
    if (s_.data.train.empty()) {
      return Fail("data.train",
                  "is required; a path or glob of llm.c token shards, e.g. data/train_*.bin");
    }
    return OkStatus();
  }

  Status CheckTrain() const {
    const TrainSpec& t = s_.train;
    RETURN_IF_ERROR(AtLeast("train.steps", t.steps, 1));
    RETURN_IF_ERROR(Between("train.global_batch", t.global_batch, 1, kMaxBatch));
    RETURN_IF_ERROR(Between("train.micro_batch", t.micro_batch, 1, kMaxBatch));
    if (t.micro_batch > t.global_batch) {
      return Fail("train.micro_batch",
                  Num(int64_t{t.micro_batch}) + " is larger than train.global_batch (" +
                      Num(int64_t{t.global_batch}) + "); micro_batch must be at most global_batch");
    }
    if (t.global_batch % t.micro_batch != 0) {
      return Fail("train.global_batch",
                  Num(int64_t{t.global_batch}) + " is not a multiple of train.micro_batch (" +
                      Num(int64_t{t.micro_batch}) +
                      "); global_batch = micro_batch x dp x accumulation steps");
    }
    RETURN_IF_ERROR(AtLeast("train.seq_len", t.seq_len, 1));
    if (t.seq_len > s_.model.block_size) {
      return Fail("train.seq_len", Num(int64_t{t.seq_len}) + " is larger than model.block_size (" +
                                       Num(int64_t{s_.model.block_size}) +
                                       "); the model accepts at most block_size tokens");
    }
    RETURN_IF_ERROR(Positive("train.lr", t.lr));
    RETURN_IF_ERROR(NonNegative("train.min_lr", t.min_lr));
    if (t.min_lr > t.lr) {
      return Fail("train.min_lr", Num(t.min_lr) + " is larger than train.lr (" + Num(t.lr) +
                                      "); min_lr must be between 0 and lr");
    }
    RETURN_IF_ERROR(AtLeast("train.warmup_steps", t.warmup_steps, 0));
    RETURN_IF_ERROR(OneOf("train.schedule", t.schedule, {"cosine", "linear", "constant", "wsd"}));
    if (!(t.decay_fraction > 0 && t.decay_fraction <= 1)) {
      return Fail("train.decay_fraction",
                  Num(t.decay_fraction) +
                      " is not in (0, 1]: the share of train.steps over which schedule wsd "
                      "decays the learning rate, at the end of training");
    }
    RETURN_IF_ERROR(NonNegative("train.weight_decay", t.weight_decay));
    RETURN_IF_ERROR(UnitInterval("train.beta1", t.beta1));
    RETURN_IF_ERROR(UnitInterval("train.beta2", t.beta2));
    RETURN_IF_ERROR(Positive("train.eps", t.eps));
    RETURN_IF_ERROR(NonNegative("train.grad_clip", t.grad_clip));
    RETURN_IF_ERROR(AtLeast("train.eval_every", t.eval_every, 0));
    if (t.eval_every > 0) RETURN_IF_ERROR(AtLeast("train.eval_batches", t.eval_batches, 1));
    RETURN_IF_ERROR(AtLeast("train.eval_batches", t.eval_batches, 0));
    RETURN_IF_ERROR(AtLeast("train.hellaswag_examples", t.hellaswag_examples, 0));
    if (!s_.data.hellaswag.empty() && t.eval_every == 0) {
      return Fail("data.hellaswag",
                  "its examples are scored only at evaluation steps, and train.eval_every is 0: "
                  "give train.eval_every a period, or leave data.hellaswag out");
    }
    RETURN_IF_ERROR(AtLeast("train.log_every", t.log_every, 1));
    if (t.recompute != TrainSpec::kRecomputeAll && t.recompute > s_.model.n_layer) {
      return Fail("train.recompute",
                  Num(int64_t{t.recompute}) + " layers, but model.n_layer is " +
                      Num(int64_t{s_.model.n_layer}) +
                      "; give at most n_layer (a stage recomputes at most its own layers), or "
                      "'all'");
    }
    return OkStatus();
  }

  Status CheckPrecision() const {
    const PrecisionSpec& p = s_.precision;
    RETURN_IF_ERROR(OneOf("precision.dtype", p.dtype, {"fp32", "bf16", "fp16"}));
    if (!(p.initial_loss_scale >= 1 && p.initial_loss_scale <= 1e30)) {
      return Fail("precision.initial_loss_scale",
                  Num(p.initial_loss_scale) + " is out of range; must be in [1, 1e30]");
    }
    RETURN_IF_ERROR(AtLeast("precision.loss_scale_window", p.loss_scale_window, 1));
    if (p.loss_scale != "dynamic") {
      double scale = 0;
      if (!yaml_util::ParseDouble(p.loss_scale, &scale) || scale <= 0) {
        return Fail("precision.loss_scale",
                    "'" + p.loss_scale + "' is not valid; must be 'dynamic' or a positive number");
      }
      if (p.dtype != "fp16") {
        return Fail("precision.loss_scale", "a fixed scale (" + p.loss_scale +
                                                ") applies only to precision.dtype fp16, not " +
                                                p.dtype + "; use 'dynamic' or dtype fp16");
      }
    }
    return OkStatus();
  }

  Status CheckParallel() const {
    const ParallelSpec& p = s_.parallel;
    if (p.dp < 0 || p.dp > kMaxWorldSize) {
      return Fail("parallel.dp", Num(int64_t{p.dp}) +
                                     " is not valid; must be 'auto' or between 1 and " +
                                     Num(kMaxWorldSize));
    }
    RETURN_IF_ERROR(Between("parallel.pp", p.pp, 1, kMaxParallelDegree));
    RETURN_IF_ERROR(Between("parallel.tp", p.tp, 1, kMaxParallelDegree));
    if (p.zero_stage < 0 || p.zero_stage > 3) {
      return Fail("parallel.zero_stage",
                  Num(int64_t{p.zero_stage}) + " is not valid; must be 0, 1, 2 or 3");
    }
    RETURN_IF_ERROR(OneOf("parallel.pp_schedule", p.pp_schedule, {"gpipe", "1f1b", "interleaved"}));
    RETURN_IF_ERROR(CheckChunks(p));
    if (p.zero_stage >= 2 && p.pp > 1) {
      return Fail("parallel.zero_stage",
                  Num(int64_t{p.zero_stage}) + " cannot be combined with parallel.pp (" +
                      Num(int64_t{p.pp}) +
                      "): ZeRO-2/3 would reduce-scatter every stage's gradients once per "
                      "micro-batch; use zero_stage 0 or 1 with pipelines");
    }
    RETURN_IF_ERROR(CheckDpShard(p));
    RETURN_IF_ERROR(Positive("parallel.timeout_s", p.timeout_s));
    RETURN_IF_ERROR(Positive("parallel.bucket_mb", p.bucket_mb));
    RETURN_IF_ERROR(OneOf("parallel.backend", p.backend, {"auto", "gloo", "nccl"}));
    if (p.backend == "nccl" && s_.resources.device != "cuda") {
      return Fail("parallel.backend", "nccl needs resources.device cuda (it is '" +
                                          s_.resources.device +
                                          "'): NCCL moves GPU memory only; use auto or gloo");
    }
    if (!p.pp_layers.empty()) {
      RETURN_IF_ERROR(CheckPpLayers(p));
    } else if (p.Chunks() > 1 && s_.model.n_layer % (p.pp * p.Chunks()) != 0) {
      return Fail("parallel.pp_chunks",
                  Num(int64_t{p.Chunks()}) + " chunks on each of parallel.pp (" +
                      Num(int64_t{p.pp}) + ") stages are " + Num(int64_t{p.pp * p.Chunks()}) +
                      " virtual stages, which do not divide model.n_layer (" +
                      Num(int64_t{s_.model.n_layer}) +
                      "); each takes n_layer / (pp x pp_chunks) layers unless "
                      "parallel.pp_layers lists them");
    } else if (s_.model.n_layer % p.pp != 0) {
      return Fail("parallel.pp", Num(int64_t{p.pp}) + " does not divide model.n_layer (" +
                                     Num(int64_t{s_.model.n_layer}) +
                                     "); every pipeline stage takes n_layer / pp layers unless "
                                     "parallel.pp_layers lists them");
    }
    if (s_.model.n_head % p.tp != 0) {
      return Fail("parallel.tp", Num(int64_t{p.tp}) + " does not divide model.n_head (" +
                                     Num(int64_t{s_.model.n_head}) +
                                     "); every tensor-parallel rank takes n_head / tp heads");
    }
    return OkStatus();
  }

  // parallel.dp_shard: hybrid sharding groups, for the stages that shard per micro-batch.
  Status CheckDpShard(const ParallelSpec& p) const {
    if (p.dp_shard == 0) return OkStatus();
    if (p.dp_shard < 0 || p.dp_shard > kMaxWorldSize) {
      return Fail("parallel.dp_shard", Num(int64_t{p.dp_shard}) +
                                           " is not valid; must be 'all' or between 1 and " +
                                           Num(kMaxWorldSize));
    }
    if (p.zero_stage < 1) {
      return Fail("parallel.dp_shard",
                  Num(int64_t{p.dp_shard}) +
                      " shards ZeRO's state, and parallel.zero_stage is 0 (nothing sharded); "
                      "set zero_stage 1, 2 or 3, or dp_shard 'all'");
    }
    if (p.dp > 0 && p.dp % p.dp_shard != 0) {
      return Fail("parallel.dp_shard", Num(int64_t{p.dp_shard}) + " does not divide parallel.dp (" +
                                           Num(int64_t{p.dp}) +
                                           "); the dp ranks form dp / dp_shard replicas of "
                                           "dp_shard ranks each");
    }
    return OkStatus();
  }

  // parallel.pp_chunks: several only with the interleaved schedule, which needs them and a
  // pipeline to interleave.
  Status CheckChunks(const ParallelSpec& p) const {
    const std::string key = "parallel.pp_chunks";
    RETURN_IF_ERROR(Between(key, p.pp_chunks, 0, kMaxParallelDegree));
    if (p.pp_schedule != "interleaved") {
      if (p.pp_chunks > 1) {
        return Fail(key, Num(int64_t{p.pp_chunks}) +
                             " needs parallel.pp_schedule interleaved (it is '" + p.pp_schedule +
                             "'): only the interleaved schedule runs several chunks per stage");
      }
      return OkStatus();
    }
    if (p.pp_chunks == 1) {
      return Fail(key,
                  "1 with parallel.pp_schedule interleaved: interleaving needs at least 2 "
                  "chunks per stage (use 1f1b for one)");
    }
    if (p.pp < 2) {
      return Fail("parallel.pp_schedule", "interleaved needs parallel.pp of at least 2 (it is " +
                                              Num(int64_t{p.pp}) +
                                              "): there are no stages to interleave");
    }
    return OkStatus();
  }

  // The rules of StageLayers (parallel_mesh.h), with the key's line.
  Status CheckPpLayers(const ParallelSpec& p) const {
    const std::string key = "parallel.pp_layers";
    const int64_t virtual_stages = int64_t{p.pp} * p.Chunks();
    if (p.Chunks() > 1 && static_cast<int64_t>(p.pp_layers.size()) != virtual_stages) {
      return Fail(key, Num(int64_t(p.pp_layers.size())) + " entries for parallel.pp (" +
                           Num(int64_t{p.pp}) + ") x parallel.pp_chunks (" +
                           Num(int64_t{p.Chunks()}) + ") = " + Num(virtual_stages) +
                           " virtual stages; give one layer count per virtual stage");
    }
    if (p.Chunks() == 1 && static_cast<int64_t>(p.pp_layers.size()) != p.pp) {
      return Fail(key, Num(int64_t(p.pp_layers.size())) + " entries for parallel.pp (" +
                           Num(int64_t{p.pp}) + "); give one layer count per stage");
    }
    int64_t sum = 0;
    for (int n : p.pp_layers) {
      if (n < 1)
        return Fail(key, "a stage of " + Num(int64_t{n}) + " layers; each needs at least 1");
      sum += n;
    }
    if (sum != s_.model.n_layer) {
      return Fail(key, "adds up to " + Num(sum) + " layers, but model.n_layer is " +
                           Num(int64_t{s_.model.n_layer}));
    }
    return OkStatus();
  }

  Status CheckResources() const {
    const ResourcesSpec& r = s_.resources;
    RETURN_IF_ERROR(OneOf("resources.device", r.device, {"cpu", "cuda"}));
    RETURN_IF_ERROR(Between("resources.world_size.min", r.world_size.min, 1, kMaxWorldSize));
    RETURN_IF_ERROR(Between("resources.world_size.max", r.world_size.max, 1, kMaxWorldSize));
    if (r.world_size.min > r.world_size.max) {
      return Fail("resources.world_size.min",
                  Num(int64_t{r.world_size.min}) + " is larger than resources.world_size.max (" +
                      Num(int64_t{r.world_size.max}) + "); min must be at most max");
    }
    RETURN_IF_ERROR(Between("resources.threads_per_rank", r.threads_per_rank, 1, kMaxThreads));
    // A year, far past any run, keeps the limit in milliseconds well inside int64.
    if (!(std::isfinite(r.time_limit_minutes) && r.time_limit_minutes >= 0 &&
          r.time_limit_minutes <= kMaxTimeLimitMinutes)) {
      return Fail("resources.time_limit_minutes",
                  Num(r.time_limit_minutes) +
                      " is out of range; must be between 0 (no limit) and " +
                      Num(int64_t{kMaxTimeLimitMinutes}) + " (a year)");
    }
    return OkStatus();
  }

  Status CheckCheckpoint() const {
    RETURN_IF_ERROR(AtLeast("checkpoint.every_steps", s_.checkpoint.every_steps, 0));
    RETURN_IF_ERROR(NonNegative("checkpoint.every_minutes", s_.checkpoint.every_minutes));
    return AtLeast("checkpoint.keep_last", s_.checkpoint.keep_last, 1);
  }

  Status CheckFaultTolerance() const {
    const FaultToleranceSpec& f = s_.fault_tolerance;
    RETURN_IF_ERROR(AtLeast("fault_tolerance.max_restarts", f.max_restarts, 0));
    RETURN_IF_ERROR(Positive("fault_tolerance.hang_timeout_s", f.hang_timeout_s));
    const SpikeRollbackSpec& r = f.spike_rollback;
    if (!(std::isfinite(r.factor) && r.factor > 1)) {
      return Fail("fault_tolerance.spike_rollback.factor",
                  Num(r.factor) +
                      " is out of range; must be greater than 1 (a loss this many "
                      "times the recent mean counts as a spike)");
    }
    RETURN_IF_ERROR(AtLeast("fault_tolerance.spike_rollback.window", r.window, 1));
    RETURN_IF_ERROR(AtLeast("fault_tolerance.spike_rollback.skip_steps", r.skip_steps, 0));
    if (!(std::isfinite(f.straggler_factor) && f.straggler_factor > 1)) {
      return Fail("fault_tolerance.straggler_factor",
                  Num(f.straggler_factor) +
                      " is out of range; must be greater than 1 (a rank this many times "
                      "slower than its stage's others is a straggler)");
    }
    RETURN_IF_ERROR(
        NonNegative("fault_tolerance.replace_stragglers_after_s", f.replace_stragglers_after_s));
    if (f.replace_stragglers_after_s > 0 && !s_.checkpoint.enabled()) {
      return Fail("fault_tolerance.replace_stragglers_after_s",
                  Num(f.replace_stragglers_after_s) +
                      " needs checkpoints: a straggler is replaced at a checkpoint, and "
                      "checkpoint.every_steps and checkpoint.every_minutes are 0");
    }
    return OkStatus();
  }

  // At least one world size in [min, max] must admit the dp x pp x tp layout.
  Status CheckLayout() const {
    if (!s_.FeasibleWorldSizes().empty()) return OkStatus();
    const WorldSizeSpec& ws = s_.resources.world_size;
    // Point at what the user pinned: an explicit dp, else the world size range.
    const std::string path = s_.parallel.dp > 0 ? "parallel.dp" : "resources.world_size";
    if (ws.min == ws.max) return Fail(path, s_.ValidateForWorldSize(ws.min).message());
    std::string reasons;
    constexpr int kShown = 3;
    for (int w = ws.min; w <= ws.max && w < ws.min + kShown; ++w) {
      reasons += (reasons.empty() ? "" : "; ") + s_.ValidateForWorldSize(w).message();
    }
    if (ws.max - ws.min + 1 > kShown) reasons += "; ...";
    return Fail(path, "no world size in [" + Num(int64_t{ws.min}) + ", " + Num(int64_t{ws.max}) +
                          "] fits the parallel layout: " + reasons);
  }

  const JobSpec& s_;
  const SourceMap& src_;
};

}  // namespace

Status ValidateSpec(const JobSpec& spec, const SourceMap& sources) {
  return Rules(spec, sources).Check();
}

}  // namespace spec_internal

Status JobSpec::Validate() const {
  return spec_internal::ValidateSpec(*this, spec_internal::SourceMap());
}

Status JobSpec::ValidateForWorldSize(int world_size) const {
  return ParallelMesh::Create(*this, world_size).status();
}

std::vector<int> JobSpec::FeasibleWorldSizes() const {
  std::vector<int> sizes;
  const int lo = std::max(1, resources.world_size.min);
  const int hi = std::min<int>(resources.world_size.max, kMaxWorldSize);
  for (int w = lo; w <= hi; ++w) {
    if (ValidateForWorldSize(w).ok()) sizes.push_back(w);
  }
  return sizes;
}

}  // namespace drover
