#include "coordinator/straggler.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/median.h"

namespace drover::coordinator {

std::vector<Straggler> FindStragglers(const std::vector<RankPace>& ranks, double factor) {
  std::map<int, std::vector<const RankPace*>> stages;
  for (const RankPace& r : ranks) {
    if (r.busy_ms > 0) stages[r.pp_stage].push_back(&r);
  }
  std::vector<Straggler> found;
  for (const auto& [stage, members] : stages) {
    if (members.size() < 2) continue;
    for (const RankPace* r : members) {
      std::vector<double> others;
      for (const RankPace* o : members) {
        if (o != r) others.push_back(o->busy_ms);
      }
      const double peers = Median(others);
      if (r->busy_ms > factor * peers && r->busy_ms - peers >= kStragglerMinExcessMs) {
        found.push_back({r->rank, r->busy_ms, peers, static_cast<int>(others.size())});
      }
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Straggler& a, const Straggler& b) { return a.rank < b.rank; });
  return found;
}

std::string StragglerNotice(const Straggler& s) {
  const auto ms = [](double v) { return std::to_string(std::llround(v)) + " ms"; };
  const std::string others =
      s.peers == 1 ? "the other rank" : "the other " + std::to_string(s.peers) + " ranks";
  return "busy " + ms(s.busy_ms) + " a step, against " + ms(s.peers_busy_ms) + " for " + others +
         " of its stage" + (s.peers > 1 ? " (median)" : "") + ": they wait for it at every step";
}

std::optional<Shrink> ShrinkWithout(int stragglers, int world_size,
                                    const std::vector<int>& feasible, double healthy_step_ms,
                                    double step_ms_now) {
  if (stragglers <= 0 || healthy_step_ms <= 0) return std::nullopt;
  int smaller = 0;
  for (int s : feasible) {
    if (s <= world_size - stragglers) smaller = s;
  }
  if (smaller <= 0) return std::nullopt;
  const double after = healthy_step_ms * world_size / smaller;
  if (after * (1 + kShrinkMargin) > step_ms_now) return std::nullopt;
  return Shrink{smaller, after};
}

}  // namespace drover::coordinator
