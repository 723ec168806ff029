// drover cordon NODE [--slot S] [--reason TEXT]: takes a node, or one GPU of it, out of
// service until drover uncordon: nothing new is placed on it, and what runs there runs on
// (a job on it moves off at its next restart).
// drover drain NODE [--slot S] [--reason TEXT] [--grace D] [--wait [--timeout S]]: cordons it
// and moves its trainers off: each saves its job's checkpoint and leaves (killed after D, by
// default the agent's --stop-grace-ms), and the jobs restart elsewhere from it, not counted
// as restarts (the node's maintenance, not their fault).
// With --slot, only that slot: the job with a rank there moves it off at a checkpoint its
// ranks save now. With --wait, returns once no trainer runs there: exit 0, or 1 when S
// passed first.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <iostream>
#include <optional>

#include "cli/command.h"
#include "cli/poll.h"
#include "cli/progress.h"
#include "cli/rpc_client.h"
#include "common/duration.h"

namespace drover::cli {
namespace {

struct Args {
  std::string node;
  int slot = -1;
  std::string reason;
  bool wait = false;
  double timeout_s = 0;
  std::string grace;  // drover drain --grace: "10m"; "": the agent's
};

void AddNodeOptions(CLI::App* app, Args* args) {
  app->add_option("node", args->node, "worker name (drover workers lists them)")->required();
  app->add_option("--reason", args->reason,
                  "why, shown by drover workers until drover uncordon (\"new NIC\")");
}

// Polls the workers until `node` runs no trainer (or is dead: what ran there is gone).
int WaitForDrain(RpcClient& client, const std::string& node, double timeout_s) {
  int running = -1;
  const auto poll = [&]() -> std::optional<int> {
    auto resp = client.ListWorkers();
    if (!resp.ok()) return ReportError(resp.status());
    running = -1;
    for (const v1::WorkerInfo& w : resp->workers()) {
      if (w.node().name() != node) continue;
      running = w.node().state() == v1::NODE_DEAD ? 0 : w.trainers_size();
    }
    if (running < 0) {
      std::cerr << "drover: node " << node << " is no longer known to the coordinator\n";
      return kExitFailure;
    }
    if (running > 0) return std::nullopt;
    std::cout << node << " is drained: no trainer runs there; it stays out of service until "
              << "drover uncordon " << node << "\n";
    return kExitOk;
  };
  return PollUntil(timeout_s, poll, [&] {
    std::cerr << "drover: timed out after " << timeout_s << " s with " << running
              << " trainer(s) still on " << node << "\n";
    return kExitFailure;
  });
}

CommandRun SetupCordon(CLI::App* app, GlobalOptions* globals) {
  auto args = std::make_shared<Args>();
  AddNodeOptions(app, args.get());
  app->add_option("--slot", args->slot,
                  "only this slot (one GPU): the node's other slots stay in use")
      ->check(CLI::NonNegativeNumber);
  return [args, globals]() -> int {
    RpcClient client(*globals);
    auto resp = client.Cordon(args->node, /*drain=*/false, args->reason, args->slot);
    if (!resp.ok()) return ReportError(resp.status());
    if (args->slot >= 0) {
      const std::string slot = std::to_string(args->slot);
      std::cout << args->node << " slot " << slot
                << " is cordoned: nothing new is placed on it until drover uncordon " << args->node
                << " --slot " << slot
                << "; the node's other slots stay in use, and what runs on this one runs on "
                   "(drover drain "
                << args->node << " --slot " << slot << " moves it off)\n";
      return kExitOk;
    }
    std::cout << args->node << " is cordoned: nothing new is placed on it until drover uncordon "
              << args->node << "; what runs there runs on (drover drain moves it off)\n";
    return kExitOk;
  };
}

// Polls `job` until no rank of its current attempt runs on `node`'s `slot`, or it ended.
int WaitForSlotDrain(RpcClient& client, const std::string& node, int slot, const std::string& job,
                     double timeout_s) {
  const std::string where = node + " slot " + std::to_string(slot);
  const auto poll = [&]() -> std::optional<int> {
    auto info = client.GetJob(job);
    if (!info.ok()) return ReportError(info.status());
    for (const v1::RankAssignment& r : info->job().placement()) {
      if (r.node() == node && r.slot() == slot) return std::nullopt;
    }
    std::cout << where << " is drained: no rank of " << job
              << " runs there; it stays out of service until drover uncordon " << node << " --slot "
              << slot << "\n";
    return kExitOk;
  };
  return PollUntil(timeout_s, poll, [&] {
    std::cerr << "drover: timed out after " << timeout_s << " s with a rank of " << job
              << " still on " << where << "\n";
    return kExitFailure;
  });
}

// The slot's drain (drover drain NODE --slot S).
int DrainSlot(RpcClient& client, const Args& args) {
  auto resp = client.Cordon(args.node, /*drain=*/true, args.reason, args.slot);
  if (!resp.ok()) return ReportError(resp.status());
  const std::string slot = std::to_string(args.slot);
  std::cout << args.node << " slot " << slot << " is cordoned until drover uncordon " << args.node
            << " --slot " << slot << "; "
            << (resp->jobs().empty() ? "no job runs there" : "the job running there moves off it")
            << "\n";
  if (resp->jobs().empty()) return kExitOk;
  std::cout << "  " << resp->jobs(0)
            << (resp->jobs_checkpoint(0)
                    ? ": moves its rank at the checkpoint its ranks save now"
                    : ": saves no checkpoints (checkpoint.every_steps and every_minutes are 0): "
                      "starts again from step 0")
            << "\n";
  if (!args.wait) return kExitOk;
  return WaitForSlotDrain(client, args.node, args.slot, resp->jobs(0), args.timeout_s);
}

CommandRun SetupDrain(CLI::App* app, GlobalOptions* globals) {
  auto args = std::make_shared<Args>();
  AddNodeOptions(app, args.get());
  app->add_option("--slot", args->slot,
                  "only this slot (one GPU): the job with a rank there moves it off, the node's "
                  "other slots stay in use")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--grace", args->grace,
                  "how long each trainer of the node has to save its job's checkpoint and leave "
                  "before it is killed: 90s, 10m, 1h (at most a day; default: the agent's "
                  "--stop-grace-ms); not with --slot");
  app->add_flag("--wait", args->wait, "return once no trainer runs on the node");
  app->add_option("--timeout", args->timeout_s,
                  "with --wait: give up after S seconds (default: never)")
      ->check(CLI::NonNegativeNumber);
  return [args, globals]() -> int {
    RpcClient client(*globals);
    int64_t grace_ms = 0;
    if (!args->grace.empty()) {
      StatusOr<int64_t> parsed = ParseDurationMs(args->grace, "--grace");
      if (!parsed.ok()) return ReportError(parsed.status());
      if (*parsed == 0) {
        return ReportError(InvalidArgumentError(
            "--grace 0 would kill the trainers at once, losing what they trained since their "
            "last checkpoint; leave --grace out for the agent's --stop-grace-ms"));
      }
      // The coordinator refuses what is out of range, or given with --slot, saying why.
      grace_ms = std::min<int64_t>(*parsed, INT32_MAX);
    }
    if (args->slot >= 0 && grace_ms == 0) return DrainSlot(client, *args);
    auto resp = client.Cordon(args->node, /*drain=*/true, args->reason, args->slot,
                              static_cast<int>(grace_ms));
    if (!resp.ok()) return ReportError(resp.status());
    std::cout << args->node << " is cordoned until drover uncordon " << args->node << "; "
              << (resp->jobs().empty() ? "no job runs there"
                                       : "its trainers save their jobs' checkpoints and leave")
              << (resp->jobs().empty() || grace_ms == 0
                      ? ""
                      : ", each killed if still running " + FormatDurationMs(grace_ms) +
                            " after its signal")
              << "\n";
    for (int i = 0; i < resp->jobs_size(); ++i) {
      std::cout << "  " << resp->jobs(i)
                << (resp->jobs_checkpoint(i)
                        ? ": restarts elsewhere from the checkpoint its ranks save now"
                        : ": saves no checkpoints (checkpoint.every_steps and every_minutes are "
                          "0): starts again from step 0")
                << "\n";
    }
    if (!args->wait) return kExitOk;
    return WaitForDrain(client, args->node, args->timeout_s);
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("cordon",
                        "Take a node, or one GPU of it, out of service: nothing new is placed "
                        "on it",
                        SetupCordon);
DROVER_REGISTER_COMMAND("drain",
                        "Take a node, or one GPU of it, out of service and move its trainers "
                        "off, each with its job's checkpoint",
                        SetupDrain);

}  // namespace drover::cli
