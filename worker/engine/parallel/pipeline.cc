#include "worker/engine/parallel/pipeline.h"

#include <algorithm>

namespace drover::engine::parallel {

StatusOr<PipelineSchedule> ParsePipelineSchedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  if (name == "1f1b") return PipelineSchedule::k1F1B;
  return InvalidArgumentError("parallel.pp_schedule: '" + name + "' is not one of gpipe, 1f1b");
}

std::vector<PipeAction> StageSchedule(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches) {
  DROVER_CHECK(stage >= 0 && stage < stages && micro_batches >= 1);
  const int m = micro_batches;
  std::vector<PipeAction> actions;
  actions.reserve(2 * m);
  auto forward = [&](int i) { actions.push_back({PipeAction::kForward, i}); };
  auto backward = [&](int i) { actions.push_back({PipeAction::kBackward, i}); };
  if (schedule == PipelineSchedule::kGPipe) {
    for (int i = 0; i < m; ++i) forward(i);
    for (int i = 0; i < m; ++i) backward(i);
    return actions;
  }
  const int warmup = std::min(stages - stage - 1, m);
  for (int i = 0; i < warmup; ++i) forward(i);
  for (int i = 0; i < m - warmup; ++i) {
    forward(warmup + i);
    backward(i);
  }
  for (int i = m - warmup; i < m; ++i) backward(i);
  return actions;
}

int MaxInFlight(PipelineSchedule schedule, int stages, int stage, int micro_batches) {
  if (schedule == PipelineSchedule::kGPipe) return micro_batches;
  return std::min(stages - stage, micro_batches);
}

}  // namespace drover::engine::parallel
