// drover workers [--all] [--gpus] [--json]: every node, its state, slots and the trainers it
// runs now (--all: also those that exited, as long as their agents still report them; --gpus:
// what NVML reads of each GPU).
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "cli/progress.h"
#include "cli/rpc_client.h"
#include "cli/slots_out.h"

namespace drover::cli {
namespace {

CommandRun SetupWorkers(CLI::App* app, GlobalOptions* globals) {
  auto all = std::make_shared<bool>(false);
  auto gpus = std::make_shared<bool>(false);
  app->add_flag("--json", globals->json, "protobuf JSON for scripts");
  app->add_flag("--all", *all, "also list trainers that exited");
  app->add_flag("--gpus", *gpus,
                "also a table of each GPU as its agent's NVML read it last: busy, memory, "
                "temperature, power, and what slows it down");
  return [globals, all, gpus]() -> int {
    RpcClient client(*globals);
    auto resp = client.ListWorkers(*all);
    if (!resp.ok()) return ReportError(resp.status());
    if (globals->json) {
      std::cout << ToJson(*resp);
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows;
    for (const v1::WorkerInfo& w : resp->workers()) {
      const v1::NodeRecord& n = w.node();
      std::string state = v1::NodeState_Name(n.state());
      if (state.rfind("NODE_", 0) == 0) state = state.substr(5);
      if (w.draining()) state = "DRAINING";  // its trainers are leaving with checkpoints
      std::string device = n.slots().empty() ? "-" : v1::DeviceKind_Name(n.slots(0).device());
      // A GPU node's first slot as the agent's probe described it: "cuda:0 NVIDIA H200 (139
      // GiB)" shows as "CUDA NVIDIA H200 (139 GiB)".
      if (!n.slots().empty() && n.slots(0).device() == v1::CUDA) {
        const std::string& what = n.slots(0).description();
        if (const size_t space = what.find(' '); space != std::string::npos) {
          device += what.substr(space);
        }
      }
      std::string jobs;
      for (const v1::TrainerStatus& t : w.trainers()) {
        if (!jobs.empty()) jobs += ",";
        jobs += t.job_id() + "/" + std::to_string(t.rank());
      }
      rows.push_back({n.name(), state, device, std::to_string(n.slots_size()),
                      std::to_string(w.free_slots()), FailuresCell(n, resp->now_ms()), n.address(),
                      jobs.empty() ? "-" : jobs});
    }
    std::cout << FormatTable(
        {"NAME", "STATE", "DEVICE", "SLOTS", "FREE", "FAILURES", "ADDRESS", "TRAINERS"}, rows);
    for (const v1::WorkerInfo& w : resp->workers()) {
      if (std::string line = OperatorCordonLine(w.node(), resp->now_ms()); !line.empty()) {
        std::cout << line << "\n";
      }
      for (const std::string& line : SlotsOutLines(w.node(), resp->now_ms())) {
        std::cout << line << "\n";
      }
      for (const std::string& line : SlowedGpuLines(w)) std::cout << line << "\n";
    }
    if (*gpus) {
      std::vector<std::vector<std::string>> gpu_rows;
      for (const v1::WorkerInfo& w : resp->workers()) {
        for (std::vector<std::string>& row : GpuRows(w)) gpu_rows.push_back(std::move(row));
      }
      std::cout << "\n"
                << (gpu_rows.empty() ? "no GPU readings: agents send them with --device cuda "
                                       "where NVML answers\n"
                                     : FormatTable(GpuTableHeader(), gpu_rows));
    }
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("workers", "List worker nodes", SetupWorkers);

}  // namespace drover::cli
