// drover logs JOB [--rank R] [-f]: the trainer's output, as shipped to the coordinator.
// -f follows until the job ends, through coordinator restarts.
#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>
#include <thread>

#include "cli/command.h"
#include "cli/rpc_client.h"

namespace drover::cli {
namespace {

CommandRun SetupLogs(CLI::App* app, GlobalOptions* globals) {
  struct Args {
    std::string job;
    int rank = 0;
    bool follow = false;
  };
  auto args = std::make_shared<Args>();
  app->add_option("job", args->job, "job id")->required();
  app->add_option("--rank", args->rank, "rank whose log to print (default 0)")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("-f,--follow", args->follow, "keep printing until the job ends");
  return [args, globals]() -> int {
    RpcClient client(*globals);
    int64_t offset = 0;
    bool reached = false;  // the coordinator answered at least once
    bool lost = false;     // said so on stderr since it last answered
    for (;;) {
      auto resp = client.ReadLogs(args->job, args->rank, offset);
      if (!resp.ok()) {
        // Following rides through a coordinator restart, as drover wait does: its copy of
        // the log survives the restart, so reading on from `offset` neither repeats nor
        // loses a line. ReadLogs itself retried with back-off for --retry-for; this keeps
        // trying after that, a second apart, until the job ends or the user gives up.
        if (!args->follow || !reached || resp.status().code() != StatusCode::kUnavailable) {
          return ReportError(resp.status());
        }
        if (!lost) std::cerr << "drover: lost the coordinator; reconnecting\n";
        lost = true;
        std::this_thread::sleep_for(std::chrono::seconds(1));
        continue;
      }
      reached = true;
      lost = false;
      std::cout << resp->data() << std::flush;
      const bool more = resp->next_offset() > offset && !resp->data().empty();
      offset = std::max(offset, resp->next_offset());
      if (more) continue;  // drain what is there before deciding to stop or sleep
      if (!args->follow || resp->job_finished()) return kExitOk;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("logs", "Print a trainer's log (-f follows)", SetupLogs);

}  // namespace drover::cli
