#include "worker/engine/parallel/pipeline.h"

#include <algorithm>

namespace drover::engine::parallel {

StatusOr<PipelineSchedule> ParsePipelineSchedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  if (name == "1f1b") return PipelineSchedule::k1F1B;
  if (name == "interleaved") return PipelineSchedule::kInterleaved;
  return InvalidArgumentError("parallel.pp_schedule: '" + name +
                              "' is not one of gpipe, 1f1b, interleaved");
}

namespace {

// Every schedule here runs `warmup` forwards, then one forward and one backward in turn,
// then the backwards left; action(kind, k) is the k-th forward or backward of the stage.
// GPipe is the case warmup = total.
template <typename ActionFn>
std::vector<PipeAction> WarmUpThenAlternate(int total, int warmup, ActionFn action) {
  std::vector<PipeAction> actions;
  actions.reserve(2 * total);
  for (int k = 0; k < warmup; ++k) actions.push_back(action(PipeAction::kForward, k));
  for (int k = 0; k < total - warmup; ++k) {
    actions.push_back(action(PipeAction::kForward, warmup + k));
    actions.push_back(action(PipeAction::kBackward, k));
  }
  for (int k = total - warmup; k < total; ++k) actions.push_back(action(PipeAction::kBackward, k));
  return actions;
}

// Megatron's interleaved order (see the header): the k-th forward (or, with the chunks
// reversed, backward) of a stage.
PipeAction InterleavedAction(PipeAction::Kind kind, int k, int stages, int chunks) {
  const int group = stages * chunks;
  int chunk = (k % group) / stages;
  if (kind == PipeAction::kBackward) chunk = chunks - 1 - chunk;
  return {kind, (k / group) * stages + k % stages, chunk};
}

}  // namespace

std::vector<PipeAction> StageSchedule(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches, int chunks) {
  DROVER_CHECK(stage >= 0 && stage < stages && micro_batches >= 1);
  DROVER_CHECK((schedule == PipelineSchedule::kInterleaved) == (chunks > 1));
  const int m = micro_batches;
  if (schedule == PipelineSchedule::kInterleaved) {
    DROVER_CHECK(m % stages == 0);
    const int total = m * chunks;
    // m == p: nothing would alternate before every forward is in (Megatron's choice too).
    const int warmup =
        m == stages ? total : std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
    return WarmUpThenAlternate(total, warmup, [&](PipeAction::Kind kind, int k) {
      return InterleavedAction(kind, k, stages, chunks);
    });
  }
  const int warmup = schedule == PipelineSchedule::kGPipe ? m : std::min(stages - stage - 1, m);
  return WarmUpThenAlternate(m, warmup, [](PipeAction::Kind kind, int k) {
    return PipeAction{kind, k};
  });
}

int MaxInFlight(const std::vector<PipeAction>& actions, int chunk) {
  int held = 0, most = 0;
  for (const PipeAction& a : actions) {
    if (a.chunk != chunk) continue;
    held += a.kind == PipeAction::kForward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

std::vector<int> BalancedStageLayers(int L, int C, int V, int T, int stages) {
  DROVER_CHECK(stages >= 1 && L >= stages && C >= 1 && V >= 1 && T >= 1);
  if (stages == 1) return {L};
  // In units of one layer: the head is `head` layers of work.
  const double layer = 24.0 * C * C + 4.0 * C * T;
  const double head = 2.0 * C * V / layer;
  // The last stage takes `last` layers; the others split the rest as evenly as they can,
  // the earlier ones taking the remainder. Every `last` is tried: L is small.
  std::vector<int> best;
  double best_cost = 0;
  for (int last = 1; last <= L - (stages - 1); ++last) {
    std::vector<int> layers(stages, 0);
    layers[stages - 1] = last;
    const int rest = L - last, others = stages - 1;
    for (int s = 0; s < others; ++s) layers[s] = rest / others + (s < rest % others ? 1 : 0);
    double cost = last + head;
    for (int s = 0; s < others; ++s) cost = std::max(cost, static_cast<double>(layers[s]));
    if (best.empty() || cost < best_cost) best = layers, best_cost = cost;
  }
  return best;
}

}  // namespace drover::engine::parallel
