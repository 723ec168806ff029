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
                                    const std::vector<int>& feasible,
                                    const std::map<int, double>& healthy, double step_ms_now) {
  if (stragglers <= 0) return std::nullopt;
  int smaller = 0;
  for (int s : feasible) {
    if (s <= world_size - stragglers) smaller = s;
  }
  if (smaller <= 0) return std::nullopt;
  Shrink shrink{smaller, 0, 0, 0};
  for (int from : {smaller, world_size}) {
    auto it = healthy.find(from);
    if (it == healthy.end() || it->second <= 0) continue;
    shrink.from_size = from;
    shrink.from_pace_ms = it->second;
    shrink.step_ms_after = it->second * from / smaller;
    break;
  }
  if (shrink.from_size == 0) return std::nullopt;
  if (shrink.step_ms_after * (1 + kShrinkMargin) > step_ms_now) return std::nullopt;
  return shrink;
}

}  // namespace drover::coordinator
