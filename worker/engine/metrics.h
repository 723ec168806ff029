// Per-step training metrics: one JSON object per line in <output_dir>/metrics.jsonl
// (DESIGN.md "Interfaces"), the same numbers the log line shows.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "common/status.h"

namespace drover::engine {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the number of optimizer steps completed
  double loss = 0;   // mean training loss over the step's micro-batches
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double tokens_per_s = 0;
  double step_ms = 0;
  // Model FLOPs utilisation: the model FLOPs of the step's tokens (gpt_flops.h) a second,
  // over every rank's peak (TrainerOptions::peak_tflops); written when that peak is known.
  std::optional<double> mfu;
  double data_wait_ms = 0;  // time the step waited on the data loader
  int world_size = 1;
  int64_t attempt = 0;
  // The mesh: dp x pp x tp = world_size, the model chunks per pipeline stage (interleaved
  // schedule), the ZeRO stage and the dp ranks it shards over (dp, or under hybrid
  // sharding parallel.dp_shard).
  int dp = 1;
  int pp = 1;
  int tp = 1;
  int pp_chunks = 1;
  int zero_stage = 0;
  int dp_shard = 1;
  double comm_ms = 0;       // data-parallel communication during forward and backward
  double comm_wait_ms = 0;  // of which the step waited for (the rest hid behind compute)
  double publish_ms = 0;    // ZeRO-1/2's all-gather of the updated parameters
  double pp_wait_ms = 0;    // time blocked on transfers with neighbouring pipeline stages
  // From the previous step's end to this one's (the first: this step alone): the time this
  // rank's collectives and transfers took once its part of each was ready, every group
  // summed (Communicator::wait_seconds; for Gloo's dp reductions, which run beside
  // backward, what the step blocked for them; NCCL's count from the GPU reaching each, and
  // may overlap the backward after it), and the rest of that time, at least 0: the rank's
  // own, computing, reading data, and whatever it did between the steps. A rank its peers
  // wait for shows the most busy_ms of them (coordinator/straggler.h).
  double peer_wait_ms = 0;
  double busy_ms = 0;
  int pp_stage = 0;  // this rank's pipeline stage: ranks of one stage do the same work
  // MiB rank 0 holds for parameters, gradients, AdamW state and ZeRO's transient buffers.
  double param_mib = 0, grad_mib = 0, optimizer_mib = 0, working_mib = 0;
  // MiB rank 0 holds for activations (every micro-batch in flight; train.recompute).
  double activation_mib = 0;
  std::optional<double> val_loss;  // present on evaluation steps
  // data.hellaswag's accuracy by mean loss per ending token (acc_norm), on evaluation steps.
  std::optional<double> hellaswag;
  // Loss-spike rollbacks so far (fault_tolerance.spike_rollback); written when > 0. After a
  // rollback step numbers repeat: this tells the lines apart.
  int64_t rollbacks = 0;
  bool spike = false;  // this step's loss was a spike: it was rolled back
  // fp16 runs: the loss scale of this step's backward, and whether its gradients overflowed
  // so that the optimizer step was skipped.
  std::optional<double> loss_scale;
  bool skipped = false;
  // Device runs: device allocations (cudaMalloc) made during the step. Each synchronises
  // the GPU; after the first step there should be none (Ops::device_allocations).
  std::optional<int64_t> device_allocations;
  // Device runs: the device memory the trainer's kernel table holds at the step's end, and
  // the most it has held at once so far (Ops::device_bytes), in MiB.
  std::optional<double> device_mib, device_peak_mib;
};

// The JSON object for `m`, one line, no trailing newline. Keys: step, loss, lr, grad_norm,
// tokens_per_s, step_ms, world_size, attempt, data_wait_ms, dp, pp, tp, pp_chunks, zero_stage,
// dp_shard, comm_ms, comm_wait_ms, publish_ms, pp_wait_ms, peer_wait_ms, busy_ms, param_mib,
// grad_mib, optimizer_mib, working_mib, activation_mib, and mfu, val_loss, hellaswag, rollbacks,
// spike, loss_scale, skipped, device_allocations, device_mib and device_peak_mib when present.
// Non-finite numbers are written as null (JSON has no NaN).
std::string StepMetricsToJson(const StepMetrics& m);

// Appends lines to a metrics file. Each line is flushed at once so that `tail -f` and a
// crash both see whole lines. Thread-compatible.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Opens `path` for appending, creating its directory. Errors name the path.
  Status Open(const std::string& path);
  Status Append(const StepMetrics& m);
  bool is_open() const { return file_ != nullptr; }

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace drover::engine
