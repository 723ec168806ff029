// Pipeline schedules (GPipe; 1F1B as in PipeDream-flush / Megatron-LM; Megatron's
// interleaved 1F1B): for one stage, the order of its micro-batches' forward and backward
// passes in one optimizer step. Pure functions; the executor (parallel_gpt.cc) runs the
// actions, receiving each forward's input from the previous stage and each backward's
// output gradient from the next.
//
//   GPipe: F0 F1 .. F(m-1) then B0 B1 .. B(m-1); every micro-batch's activations are held
//          until its backward: m sets in flight.
//   1F1B:  stage s of p first runs w = min(p - s - 1, m) forwards (warm-up), then
//          alternates one forward and one backward, then drains the remaining w backwards;
//          at most w + 1 <= p - s sets in flight, whatever m is. With p = 1 it is plain
//          gradient accumulation: F0 B0 F1 B1 ...
// Both have the same bubble, (p - 1) / (m + p - 1) of a step; 1F1B bounds memory.
//
//   Interleaved: each stage holds v model chunks, chunk c of stage s being virtual stage
//          c * p + s of p * v (so a micro-batch passes every stage v times, the last stage
//          handing it back to the first between chunks). A stage runs its m * v forwards in
//          groups of p micro-batches per chunk: the k-th forward is micro-batch
//          (k / (p v)) p + k % p of chunk (k / p) % v, and the k-th backward the same with
//          the chunks reversed. Warm-up is (p - s - 1) * 2 + (v - 1) * p forwards (all of
//          them when m == p), then one forward and one backward alternate. The bubble
//          shrinks by v, to (p - 1) / (v m + p - 1), for v times the point-to-point
//          transfers and more activation sets in flight. m must be a multiple of p.
// Backwards of one chunk run in micro-batch order on every stage, so a stage's k-th
// backward of a chunk always consumes the k-th gradient its successor sent for it.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace drover::engine::parallel {

enum class PipelineSchedule { kGPipe, k1F1B, kInterleaved };

// "gpipe" | "1f1b" | "interleaved" (parallel.pp_schedule); InvalidArgument otherwise.
StatusOr<PipelineSchedule> ParsePipelineSchedule(const std::string& name);

struct PipeAction {
  enum Kind { kForward, kBackward };
  Kind kind = kForward;
  int micro_batch = 0;
  int chunk = 0;  // the stage's model chunk (interleaved; 0 otherwise)
  friend bool operator==(const PipeAction&, const PipeAction&) = default;
};

// Layer counts for `stages` stages of a GPT of L layers, C channels and vocabulary V at
// sequence length T that balance the stages' compute: a layer costs 24 C^2 + 4 C T FLOPs
// per token (its GEMMs and attention's two T-long products), the last stage's LM head
// 2 C V more (forward; backward scales both alike), the embedding nothing. The counts
// (each at least 1) minimise the largest stage's cost. parallel.pp_layers is the user's
// choice; this is what the trainer suggests when the even split leaves the first stages
// waiting for the last (1F1B holds more activations on the earlier stages, so the
// balanced split costs them memory).
std::vector<int> BalancedStageLayers(int L, int C, int V, int T, int stages);

// The actions of stage `stage` (0-based) of `stages` for `micro_batches` micro-batches, over
// `chunks` model chunks (1 for GPipe and 1F1B; at least 2 for the interleaved schedule,
// which also needs micro_batches to be a multiple of stages). CHECKs those and
// 0 <= stage < stages, micro_batches >= 1.
std::vector<PipeAction> StageSchedule(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches, int chunks = 1);

// The most micro-batches of `chunk` whose activations `actions` hold at once (forwards
// done, backwards not yet): how many activation sets that chunk needs. Each chunk's
// forwards and backwards run in micro-batch order, so the ones in flight are consecutive
// and micro-batch i can use set i % MaxInFlight.
int MaxInFlight(const std::vector<PipeAction>& actions, int chunk = 0);

}  // namespace drover::engine::parallel
