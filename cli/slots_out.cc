#include "cli/slots_out.h"

#include <algorithm>
#include <cstdio>

#include "cli/progress.h"
#include "common/node_slots.h"

namespace drover::cli {
namespace {

// "cordoned for 4m49s (1 failure)", "(slow once)", "(2 failures, slow once)": its
// cordons so far, those of a straggler's slot told apart (it was slow, not broken).
std::string Cordon(const v1::SlotFault& f, int64_t now_ms) {
  const int slow = std::clamp(f.slow(), 0, f.failures());
  const int failed = f.failures() - slow;
  std::string counts;
  if (failed > 0 || slow == 0) {
    counts = std::to_string(failed) + (failed == 1 ? " failure" : " failures");
  }
  if (slow > 0) {
    counts += std::string(counts.empty() ? "" : ", ") + "slow " +
              (slow == 1 ? std::string("once") : std::to_string(slow) + " times");
  }
  return "cordoned for " + FormatDurationMs(f.cordon_until_ms() - now_ms) + " (" + counts + ")";
}

// Whether cordon `f` is for health finding `fault` (the coordinator's reason ends with it).
bool ForFinding(const v1::SlotFault& f, const std::string& fault) {
  const std::string& reason = f.reason();
  return reason.size() >= fault.size() &&
         reason.compare(reason.size() - fault.size(), fault.size(), fault) == 0;
}

// "61.2/141.0 GiB".
std::string Memory(const v1::GpuTelemetry& g) {
  if (g.memory_total_bytes() == 0) return "-";
  char buf[48];
  snprintf(buf, sizeof(buf), "%.1f/%.1f GiB",
           static_cast<double>(g.memory_used_bytes()) / (1 << 30),
           static_cast<double>(g.memory_total_bytes()) / (1 << 30));
  return buf;
}

// "WHAT: cordoned by root@host: new NIC, 5m12s ago (until drover uncordon ARGS)": an
// operator's cordon `why` of `what` since wall time `at_ms` (0: unknown).
std::string OperatorLine(const std::string& what, const std::string& why, int64_t at_ms,
                         int64_t now_ms, const std::string& uncordon_args) {
  std::string line = what + ": " + why;
  if (at_ms > 0 && now_ms >= at_ms) line += ", " + FormatDurationMs(now_ms - at_ms) + " ago";
  return line + " (until drover uncordon " + uncordon_args + ")";
}

}  // namespace

std::vector<std::string> SlowedGpuLines(const v1::WorkerInfo& w) {
  std::vector<std::string> lines;
  for (const v1::GpuTelemetry& g : w.gpus()) {
    const std::string notice = SlowdownNotice(g);
    if (notice.empty()) continue;
    lines.push_back(w.node().name() + " slot " + std::to_string(g.slot()) + ": " + notice +
                    ": every rank of its job waits for it at each step");
  }
  return lines;
}

std::vector<std::string> GpuTableHeader() {
  return {"NODE", "SLOT", "BUSY", "MEMORY", "TEMP", "POWER", "SLOWDOWN"};
}

std::vector<std::vector<std::string>> GpuRows(const v1::WorkerInfo& w) {
  std::vector<std::vector<std::string>> rows;
  for (const v1::GpuTelemetry& g : w.gpus()) {
    rows.push_back({w.node().name(), std::to_string(g.slot()),
                    g.has_utilization_pct() ? std::to_string(g.utilization_pct()) + "%" : "-",
                    Memory(g),
                    g.has_temperature_c() ? std::to_string(g.temperature_c()) + " C" : "-",
                    g.has_power_mw() ? std::to_string((g.power_mw() + 500) / 1000) + " W" : "-",
                    g.slowdown().empty() ? "-" : g.slowdown()});
  }
  return rows;
}

std::string OperatorCordonLine(const v1::NodeRecord& n, int64_t now_ms) {
  if (n.operator_cordon().empty()) return "";
  std::string why = n.operator_cordon();
  if (n.drain() && n.drain_grace_ms() > 0) {
    why += " (trainers given " + FormatDurationMs(n.drain_grace_ms()) + " to leave)";
  }
  return OperatorLine(n.name(), why, n.operator_cordon_ms(), now_ms, n.name());
}

std::vector<std::string> SlotsOutLines(const v1::NodeRecord& n, int64_t now_ms) {
  std::vector<std::string> lines;
  auto unfit = [&](int slot) -> const v1::SlotHealth* {
    for (const v1::SlotHealth& h : n.unhealthy_slots()) {
      if (h.slot() == slot) return &h;
    }
    return nullptr;
  };
  for (const v1::SlotFault& f : n.slot_faults()) {
    if (f.operator_cordon().empty()) continue;
    const std::string slot = std::to_string(f.slot());
    lines.push_back(OperatorLine(n.name() + " slot " + slot, f.operator_cordon(),
                                 f.operator_cordon_ms(), now_ms, n.name() + " --slot " + slot));
  }
  for (const v1::SlotFault& f : n.slot_faults()) {
    if (f.cordon_until_ms() <= now_ms) continue;
    const v1::SlotHealth* h = unfit(f.slot());
    if (h != nullptr && ForFinding(f, h->fault())) continue;  // told with the finding below
    lines.push_back(n.name() + " slot " + std::to_string(f.slot()) + " " + Cordon(f, now_ms) +
                    ": " + f.reason());
  }
  for (const v1::SlotHealth& h : n.unhealthy_slots()) {
    // A latch (a critical Xid) ends only by an operator's word; another finding by itself.
    const std::string until = h.latch() != 0
                                  ? "an operator puts it back (drover uncordon " + n.name() +
                                        " --slot " + std::to_string(h.slot()) + ")"
                                  : "its GPU passes the health check";
    std::string line = n.name() + " slot " + std::to_string(h.slot()) + " out until " + until;
    for (const v1::SlotFault& f : n.slot_faults()) {
      if (f.slot() == h.slot() && f.cordon_until_ms() > now_ms && ForFinding(f, h.fault())) {
        line += ", and " + Cordon(f, now_ms);
      }
    }
    lines.push_back(line + ": " + h.fault());
  }
  return lines;
}

std::string FailuresCell(const v1::NodeRecord& n, int64_t now_ms) {
  std::string cell = std::to_string(n.failures());
  // A record of a coordinator before failure times has none to show.
  if (n.failures() > 0 && n.last_failure_ms() > 0) {
    cell += " (last " + FormatDurationMs(now_ms - n.last_failure_ms()) + " ago)";
  }
  return cell;
}

}  // namespace drover::cli
