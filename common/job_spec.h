// The job spec (DESIGN.md "Job spec"): YAML decoded into typed structs, with Validate().
//
// Key names are part of the user interface. Defaults live here, in the member initializers,
// and nowhere else. Unknown keys are errors. Every error names the field path
// ("train.micro_batch"), its YAML line when known, the bad value and what would be valid.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace drover {

struct ModelSpec {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int block_size = 64;   // longest sequence the model accepts
  int vocab_size = 256;  // padded to a multiple of 128 inside the engine
};

struct DataSpec {
  std::string train;  // llm.c token shards; glob allowed
  std::string val;    // optional
  // Optional: a file of `drover data hellaswag` (eval/hellaswag.h), its examples scored at
  // every evaluation step (train.eval_every), their accuracy logged as the loss is.
  std::string hellaswag;
};

struct TrainSpec {
  int64_t steps = 2000;
  int global_batch = 12;  // sequences per optimizer step, across all dp ranks
  int micro_batch = 12;   // sequences per forward/backward on one dp rank
  int seq_len = 64;
  double lr = 1.0e-3;
  double min_lr = 1.0e-4;
  int64_t warmup_steps = 100;
  std::string schedule = "cosine";  // cosine | linear | constant | wsd
  // wsd (warm-up, stable, decay): the share of train.steps, at the end, over which the
  // learning rate falls linearly from lr to min_lr; lr holds until then. In (0, 1].
  double decay_fraction = 0.2;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1.0e-8;
  double grad_clip = 1.0;  // 0 disables clipping
  uint64_t seed = 1337;
  int64_t eval_every = 250;  // 0 disables evaluation
  int eval_batches = 20;
  int hellaswag_examples = 0;  // of data.hellaswag, from its start; 0: all
  std::string init_from;       // optional llm.c model file or HF GPT-2 model.safetensors
  int64_t log_every = 1;
  // Activation recomputation ("activation checkpointing"): the first `recompute` layers of
  // each pipeline stage (of each model chunk under the interleaved schedule) keep only their
  // output from forward, and backward runs their forward again just before their backward.
  // Their other activations (about 16 x B x T x C floats a layer in fp32) then exist for one
  // layer at a time instead of each, for one more forward of those layers (gpt_stage.h).
  // Written 'none' (0), 'all' (kRecomputeAll) or a count of layers.
  static constexpr int kRecomputeAll = -1;
  int recompute = 0;
};

struct PrecisionSpec {
  std::string dtype = "fp32";          // fp32 | bf16 | fp16
  std::string loss_scale = "dynamic";  // dynamic | a positive number (fp16 only)
  // The dynamic scaler (fp16): where it starts, and after how many steps without an
  // overflow it doubles (each overflow halves it and skips the step).
  double initial_loss_scale = 65536.0;  // 2^16
  int64_t loss_scale_window = 2000;
};

struct ParallelSpec {
  int dp = 0;  // 0 = auto (world_size / (pp * tp))
  int pp = 1;
  int tp = 1;
  int zero_stage = 0;  // 0..3
  // Hybrid sharding (FSDP's HYBRID_SHARD, DeepSpeed's MiCS): ZeRO (stage 1-3) shards over
  // groups of this many consecutive dp ranks (a node, where the gang scheduler packs them), and the
  // dp / dp_shard groups are replicas of each other that average their gradient shards once
  // a step. 0 (written 'all'): one group of every dp rank, plain ZeRO.
  int dp_shard = 0;
  std::string pp_schedule = "1f1b";  // gpipe | 1f1b | interleaved
  // Model chunks per pipeline stage under the interleaved schedule (virtual stages =
  // pp x pp_chunks); 0 = auto (written 'auto'): 2 when interleaved, else 1.
  int pp_chunks = 0;
  // Layers of each pipeline stage, in order (pp entries, or pp x chunks under the
  // interleaved schedule: one per virtual stage; each at least 1, summing to n_layer);
  // empty: n_layer / (pp x chunks) each. Uneven counts balance the stages when the last one
  // also computes the LM head (at GPT-2's vocabulary about as much work as five layers).
  std::vector<int> pp_layers;

  // The model chunks each stage holds: pp_chunks resolved (2 for auto when interleaved).
  int Chunks() const {
    if (pp_chunks > 0) return pp_chunks;
    return pp_schedule == "interleaved" ? 2 : 1;
  }
  // Deadline of every collective and point-to-point transfer between ranks: a dead or hung
  // peer fails the others within it instead of blocking them.
  double timeout_s = 10;
  // Gradient bucket size for data-parallel reduction (PyTorch DDP's default, 25 MiB).
  double bucket_mb = 25;
  // What moves the bytes between ranks: gloo (TCP on host memory; a CUDA job's device
  // buffers are staged through the host), nccl (device memory, one GPU per rank; CUDA
  // only), or auto (nccl when the job is on CUDA and every rank has a GPU of its own, else
  // gloo).
  std::string backend = "auto";  // auto | gloo | nccl
  // NCCL: the training thread's collectives and transfers (tensor parallel, the pipeline)
  // return once enqueued, the GPU ordering the compute after them, with a watchdog thread
  // holding their deadlines (true); or only once done on the GPU (false: the host waits at
  // each, and the GPU idles while it enqueues the next kernels).
  bool stream_order = true;
};

struct WorldSizeSpec {
  int min = 1;
  int max = 1;
};

struct ResourcesSpec {
  std::string device = "cpu";  // cpu | cuda
  WorldSizeSpec world_size;
  int threads_per_rank = 1;
  // The most the job may run, in minutes, counted over all its attempts (each from its
  // placement to its end: waiting, recovering and suspended time is not counted). At the
  // limit a job that saves checkpoints is asked for one at once and stops there; one that
  // saves none stops at once. Either way it ends FAILED, its reason saying so, and is not
  // restarted (coordinator/job_manager.h, "Time limits"). The coordinator's to enforce:
  // `drover train` runs its steps whatever it says. 0: no limit.
  double time_limit_minutes = 0;
};

struct CheckpointSpec {
  std::string dir;            // default: <output_dir>/ckpt
  int64_t every_steps = 200;  // 0 disables periodic checkpoints by steps
  // Also save once this many minutes have passed since the last checkpoint (or the start of
  // the attempt), whatever the steps: it bounds the training a failure loses in time, also
  // when the step time changes (an elastic job shrunk to fewer ranks). 0 = by steps only.
  double every_minutes = 0;
  int keep_last = 3;
  bool async = true;

  // The job saves checkpoints at all: periodic ones by steps or by time.
  bool enabled() const { return every_steps > 0 || every_minutes > 0; }
};

struct SpikeRollbackSpec {
  bool enabled = false;
  double factor = 3.0;
  int window = 50;
  int skip_steps = 20;
};

struct FaultToleranceSpec {
  int max_restarts = 10;
  double hang_timeout_s = 120;
  SpikeRollbackSpec spike_rollback;
  // A rank whose own time a step is this many times its pipeline stage's others' is a
  // straggler (coordinator/straggler.h): named by drover status, and replaced when
  // replace_stragglers_after_s says so. Above 1.
  double straggler_factor = 1.2;
  // A rank named a straggler (coordinator/straggler.h) this long without a break is moved:
  // at the job's next checkpoint, asked for at once, its slot is cordoned and the job
  // resumes on a free one. Without a free slot, an elastic job whose other ranks would step
  // sooner without its stragglers shrinks to leave them out (coordinator/job_manager.h).
  // 0: stragglers are only named.
  double replace_stragglers_after_s = 0;
};

struct JobSpec {
  std::string name;
  std::string output_dir;  // default: runs/<name>
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  PrecisionSpec precision;
  ParallelSpec parallel;
  ResourcesSpec resources;
  CheckpointSpec checkpoint;
  FaultToleranceSpec fault_tolerance;

  // Checks every field and cross-field rule that does not depend on the world size, and
  // that at least one world size in [min, max] fits the layout. ParseJobSpec calls it (with
  // YAML lines in the messages); call it yourself on a spec built in code.
  Status Validate() const;

  // Checks the layout for one concrete world size: dp * pp * tp == world_size (dp=auto
  // resolves), global_batch divisible by dp * micro_batch, n_layer divisible by pp,
  // n_head divisible by tp. Errors name each factor. Does not check that world_size lies in
  // resources.world_size [min, max]: the caller picks it (scheduler, `drover train --nproc`).
  Status ValidateForWorldSize(int world_size) const;

  // The world sizes in [min, max] that ValidateForWorldSize accepts, ascending.
  std::vector<int> FeasibleWorldSizes() const;

  // How many consecutive ranks talk the most: a tensor-parallel group (tp), under hybrid
  // sharding a shard group of them (tp x dp_shard), whose collectives run every layer. The
  // scheduler keeps each such block on one node where the free slots allow.
  int RankBlock() const { return parallel.tp * std::max(parallel.dp_shard, 1); }
};

// Parses YAML text, applies `overrides` ("section.key=value", in order; values are YAML
// scalars), fills defaults, and validates. `source_name` (a file name) prefixes errors.
StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text,
                               const std::vector<std::string>& overrides = {},
                               const std::string& source_name = "job spec");

// The text of the job spec file `path`. Errors say what is wrong with the path:
// InvalidArgument "job spec 'P' is a directory, not a YAML file", or the reading error
// with its reason ("cannot read job spec 'P': open P: No such file or directory", NotFound).
StatusOr<std::string> ReadJobSpecFile(const std::string& path);

// Reads `path` (ReadJobSpecFile) and calls ParseJobSpec.
StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                  const std::vector<std::string>& overrides = {});

// Returns `yaml_text` with `overrides` applied (for the coordinator to store and hand to
// trainers, so every rank sees the same effective spec). Fails like ParseJobSpec, so the
// result always parses. Without overrides the text is returned as is (comments kept);
// with overrides it is re-emitted from the YAML tree (comments dropped).
StatusOr<std::string> ApplyOverrides(const std::string& yaml_text,
                                     const std::vector<std::string>& overrides,
                                     const std::string& source_name = "job spec");

// Serializes a spec back to YAML (every key, defaults included).
std::string JobSpecToYaml(const JobSpec& spec);

}  // namespace drover
