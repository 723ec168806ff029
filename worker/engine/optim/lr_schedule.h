// Learning-rate schedule: linear warm-up, then decay to train.min_lr at train.steps.
//
//   step < warmup_steps:  lr * (step + 1) / warmup_steps          (llm.c / nanoGPT)
//   otherwise, with r = (step - warmup_steps) / (steps - warmup_steps) clamped to [0, 1]:
//     cosine:   min_lr + 0.5 * (1 + cos(pi * r)) * (lr - min_lr)
//     linear:   min_lr + (1 - r) * (lr - min_lr)
//     constant: lr
//   wsd (warm-up, stable, decay; MiniCPM's, and Hagele et al. 2024's "constant LR with
//   cooldown"): lr until the last decay_fraction of train.steps, then linear to min_lr:
//     with d = steps - max(round(decay_fraction * steps), 1), no earlier than warmup_steps,
//     step < d: lr; otherwise min_lr + (1 - r) * (lr - min_lr), r = (step - d) / (steps - d)
//   Its learning rate does not depend on train.steps until the decay starts, so a run can
//   be continued further from a checkpoint of its stable phase.
//
// `step` is 0-based (the first optimizer step is step 0).
#pragma once

#include <cstdint>
#include <string>

#include "common/job_spec.h"
#include "common/status.h"

namespace drover::engine {

// The learning rate of optimizer step `step`. An unknown schedule name is a broken
// invariant here (JobSpec::Validate rejects it); use ValidateSchedule at the edge.
double LearningRate(const TrainSpec& train, int64_t step);

// InvalidArgument naming train.schedule unless it is cosine, linear, constant or wsd.
Status ValidateSchedule(const std::string& schedule);

}  // namespace drover::engine
