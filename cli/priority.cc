// drover priority JOB P: changes the priority of a job that has not finished: where it waits
// in the queue (higher first, FIFO within one), and which running jobs preemption shrinks
// or stops at their next checkpoints to make room for it, from the next scheduling pass on.
#include <CLI/CLI.hpp>
#include <climits>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

CommandRun SetupPriority(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string job;
    int priority = 0;
  };
  auto args = std::make_shared<Args>();
  app->add_option("job", args->job, "job id")->required();
  CLI::Option* given =
      app->add_option("priority", args->priority, "the new priority: higher runs first");
  // CLI11 takes "-5" for an option: let it leave the token over, and read it from there.
  app->allow_extras();
  return [args, globals, app, given]() -> int {
    std::vector<std::string> rest = app->remaining();
    std::erase(rest, "--");  // the positional marker, which CLI11 leaves over too
    if (given->count() == 0 && rest.size() == 1) {
      const std::string& token = rest[0];
      int64_t value = 0;
      const bool number = token.size() > 1 && token[0] == '-' &&
                          token.find_first_not_of("0123456789", 1) == std::string::npos &&
                          token.size() <= 11;
      if (number) value = std::stoll(token);
      if (!number || value < INT32_MIN) {
        std::cerr << "drover priority: '" << token << "' is not a priority (an integer)\n";
        return kExitUsage;
      }
      args->priority = static_cast<int>(value);
    } else if (given->count() == 0 || !rest.empty()) {
      std::cerr << "drover priority: usage: drover priority JOB P (an integer, negative too)"
                << (rest.empty() ? "" : "; not understood: " + rest[0]) << "\n";
      return kExitUsage;
    }
    RpcClient client(*globals);
    auto resp = client.SetPriority(args->job, args->priority);
    if (!resp.ok()) return ReportError(resp.status());
    std::cout << args->job << " " << JobStateName(resp->state()) << ", priority " << args->priority;
    if (resp->previous() != args->priority) std::cout << " (was " << resp->previous() << ")";
    std::cout << "\n";
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("priority", "Change a job's priority in the queue and for preemption",
                        SetupPriority);

}  // namespace drover::cli
