// drover top [--interval S] [--once]: a live view of the cluster, like top(1): the nodes
// with their slots and heartbeat age, and the active jobs with their progress. The frame
// is cli/top_view.h's; this file only fetches the state and repaints it.
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "cli/command.h"
#include "cli/rpc_client.h"
#include "cli/top_view.h"

namespace drover::cli {
namespace {

std::atomic<bool> g_stop{false};
void OnStop(int) { g_stop = true; }

int64_t WallNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The active jobs with what a row needs beyond the list (the spec's step count, the
// trainers' step times): one GetJob each. A job gone between the two calls is left out.
StatusOr<TopSnapshot> Fetch(RpcClient* client, const std::string& coordinator) {
  TopSnapshot s;
  s.coordinator = coordinator;
  ASSIGN_OR_RETURN(s.workers, client->ListWorkers());
  v1::ListJobsRequest request;
  for (v1::JobState state : {v1::RUNNING, v1::RECOVERING, v1::PENDING, v1::SUSPENDED}) {
    request.add_states(state);
  }
  ASSIGN_OR_RETURN(v1::ListJobsResponse listed, client->ListJobs(request));
  for (const v1::JobRecord& j : listed.jobs()) {
    auto info = client->GetJob(j.job_id());
    if (info.ok()) {
      s.jobs.push_back(std::move(info).value());
    } else if (info.status().code() != StatusCode::kNotFound) {
      return info.status();
    }
  }
  s.now_ms = WallNowMs();
  return s;
}

int TerminalWidth() {
  winsize ws = {};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

struct TopFlags {
  double interval_s = 2;
  bool once = false;
  int width = -1;  // -1: the terminal's, no limit when stdout is not one
};

int RunTop(const TopFlags& f, GlobalOptions globals) {
  // A repaint never waits much longer than its interval on a coordinator that is away.
  if (!f.once) globals.retry_for_s = std::min(globals.retry_for_s, f.interval_s);
  RpcClient client(globals);
  if (f.once) {
    auto snapshot = Fetch(&client, globals.coordinator);
    if (!snapshot.ok()) return ReportError(snapshot.status());
    std::cout << RenderTop(*snapshot, f.width >= 0 ? f.width : 0) << std::flush;
    return kExitOk;
  }
  struct sigaction sa = {};
  sa.sa_handler = OnStop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const auto interval = std::chrono::milliseconds(static_cast<int64_t>(f.interval_s * 1000));
  while (!g_stop) {
    auto snapshot = Fetch(&client, globals.coordinator);
    std::string frame;
    if (snapshot.ok()) {
      frame = RenderTop(*snapshot, f.width >= 0 ? f.width : (tty ? TerminalWidth() : 0));
    } else {
      // top keeps watching through a coordinator restart, saying so in place of a frame.
      frame = "drover top - " + globals.coordinator + ": " + snapshot.status().message() +
              " (retrying)\n";
      client = RpcClient(globals);  // dial a restarted coordinator afresh
    }
    // Home and clear on a terminal; frames one after another, a blank line apart, in a pipe.
    std::cout << (tty ? "\x1b[H\x1b[2J" : "") << frame << (tty ? "" : "\n") << std::flush;
    const auto until = std::chrono::steady_clock::now() + interval;
    while (!g_stop && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return kExitOk;
}

CommandRun SetupTop(CLI::App* app, GlobalOptions* globals) {
  auto f = std::make_shared<TopFlags>();
  app->add_option("--interval", f->interval_s, "seconds between refreshes (default 2)")
      ->check(CLI::PositiveNumber);
  app->add_flag("--once", f->once, "print one frame and exit (for scripts)");
  app->add_option("--width", f->width,
                  "cut lines to this many characters (default: the terminal's width; no limit "
                  "when not a terminal)")
      ->check(CLI::NonNegativeNumber);
  return [f, globals] { return RunTop(*f, *globals); };
}

}  // namespace

DROVER_REGISTER_COMMAND("top", "A live view of the cluster's nodes and active jobs", SetupTop);

}  // namespace drover::cli
