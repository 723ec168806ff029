// drover uncordon NODE [--slot S]: puts a node, or one GPU of it, back in service now, when
// an operator has repaired it: the cordon ends, and the failures that earned it are
// forgotten, so that the next failure starts the cool-down from its base again.
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

CommandRun SetupUncordon(CLI::App* app, GlobalOptions* globals) {
  auto node = std::make_shared<std::string>();
  auto slot = std::make_shared<int>(-1);
  app->add_option("node", *node, "worker name (drover workers lists them)")->required();
  app->add_option("--slot", *slot, "only this slot (its GPU was replaced or reset)")
      ->check(CLI::NonNegativeNumber);
  return [node, slot, globals]() -> int {
    RpcClient client(*globals);
    auto resp = client.Uncordon(*node, *slot);
    if (!resp.ok()) return ReportError(resp.status());
    const std::string what = *node + (*slot >= 0 ? " slot " + std::to_string(*slot) : "");
    if (resp->was_cordoned()) {
      std::cout << what << " is back in service\n";
    } else {
      std::cout << what << " was not cordoned; its failures are forgotten\n";
    }
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("uncordon", "Put a cordoned node or GPU back in service", SetupUncordon);

}  // namespace drover::cli
