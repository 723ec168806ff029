// What the coordinator and the CLI both need to know about a node's slots.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "proto/drover.pb.h"

namespace drover {

// Whether `slot` of `node` is out of use at wall time `now_ms`: a cordon for its GPU's
// failure has not ended or an operator cordoned it (NodeRecord.slot_faults), or its agent
// reports its GPU unfit (NodeRecord.unhealthy_slots), however long ago its cordon ended.
inline bool SlotOut(const v1::NodeRecord& node, int slot, int64_t now_ms) {
  for (const v1::SlotFault& f : node.slot_faults()) {
    if (f.slot() != slot) continue;
    if (f.cordon_until_ms() > now_ms || !f.operator_cordon().empty()) return true;
  }
  return std::any_of(node.unhealthy_slots().begin(), node.unhealthy_slots().end(),
                     [slot](const v1::SlotHealth& h) { return h.slot() == slot; });
}

// How many of `node`'s slots are out of use at `now_ms` (SlotOut).
inline int SlotsOut(const v1::NodeRecord& node, int64_t now_ms) {
  return static_cast<int>(
      std::count_if(node.slots().begin(), node.slots().end(),
                    [&](const v1::Slot& s) { return SlotOut(node, s.index(), now_ms); }));
}

// "its GPU is slowed down (thermal (hardware), at 91 C)" for a GPU whose clocks its hardware
// or driver holds down (GpuTelemetry.slowdown), "" for one they do not: said under drover
// workers and as a notice of the job whose rank runs there.
inline std::string SlowdownNotice(const v1::GpuTelemetry& g) {
  if (g.slowdown().empty()) return "";
  return "its GPU is slowed down (" + g.slowdown() +
         (g.has_temperature_c() ? ", at " + std::to_string(g.temperature_c()) + " C" : "") + ")";
}

}  // namespace drover
