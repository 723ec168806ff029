// Which ranks of a running job the others wait for: a pure function of the ranks' last
// reported pace, so that it is tested without trainers (STYLE.md: deciders return values).
//
// In data and tensor parallelism every rank of a pipeline stage does the same work and
// meets the others at each collective, so the whole stage moves at its slowest rank's pace:
// a GPU held at low clocks, a node whose CPUs something else uses, a slow disk under the
// data. Each trainer reports its busy time (TrainerProgress.busy_ms: the step without what
// it waited for its peers, a median of its last steps). A rank that keeps the others
// waiting waits least itself, so its busy time stands out from its stage's; ranks of
// different stages do different work (the last holds the LM head) and are not compared.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace drover::coordinator {

// A rank as its trainer last reported it.
struct RankPace {
  int rank = 0;
  int pp_stage = 0;
  double busy_ms = 0;  // 0: not known yet (too few steps)
};

struct Straggler {
  int rank = 0;
  double busy_ms = 0;
  double peers_busy_ms = 0;  // the median of the other known ranks of its stage
  int peers = 0;             // how many those are
};

// A rank is a straggler when its busy time exceeds the median of its stage's other ranks
// `factor` times (fault_tolerance.straggler_factor, 1.2 unless the job says otherwise: a
// fifth more is well outside the few percent that ranks doing the same work differ by on
// machines of their own) and by kStragglerMinExcessMs, which keeps tiny steps' jitter out.
// Several ranks can be stragglers at once; when most of a stage is slow, none is. Ranks
// with busy_ms 0 are left out, and so is a stage with fewer than two known ranks. By rank.
inline constexpr double kStragglerMinExcessMs = 5;
std::vector<Straggler> FindStragglers(const std::vector<RankPace>& ranks, double factor);

// "busy 152 ms a step, against 80 ms for the other 3 ranks of its stage (median): they
// wait for it at every step" (what follows "rank R on NODE slot S: " in a job's notices).
std::string StragglerNotice(const Straggler& s);

// Dropping stragglers, when no free slot can take them: the job shrinks to the largest of its
// feasible world sizes that leaves them out, and its other ranks take on their share. A step
// should then take what it took when the job last ran at that size without stragglers; or,
// never having run so, its pace without stragglers at its size now times world_size /
// smaller, since with the global batch kept (more gradient accumulation) a rank's work a
// step grows by that. Paces are TrainerProgress.pace_ms, the median step time. Ranks' busy
// times would understate it: they leave out the collectives' own time, and under NCCL a rank
// that waits for a straggler counts as waiting the bucket reductions that run beside its
// backward (communicator.h's wait_seconds). The scaled estimate leaves out whatever of a
// step does not grow with its work (the reductions), and neither counts the restart: a
// shrink is planned only when it promises a step at least kShrinkMargin shorter than now.
inline constexpr double kShrinkMargin = 0.1;
struct Shrink {
  int world_size = 0;        // the job's size without the stragglers
  double step_ms_after = 0;  // the estimate
  int from_size = 0;         // the size of the pace it was made from...
  double from_pace_ms = 0;   // ...and that pace
};
// `stragglers` ranks of a job of `world_size` whose step takes step_ms_now; `healthy`: its
// pace without stragglers at each world size it ran at so; `feasible` ascending. nullopt
// when no feasible size leaves them out, when neither the smaller size's pace nor this
// size's is known, or when dropping them does not pay.
std::optional<Shrink> ShrinkWithout(int stragglers, int world_size,
                                    const std::vector<int>& feasible,
                                    const std::map<int, double>& healthy, double step_ms_now);

}  // namespace drover::coordinator
