// drover status JOB [--json]: one job (with a progress line: step / steps, tokens/s, ETA),
// its attempts, trainers and checkpoints.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>

#include "cli/command.h"
#include "cli/progress.h"
#include "cli/rpc_client.h"
#include "common/clock.h"
#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/parallel_mesh.h"

namespace drover::cli {
namespace {

// The job's progress line: its steps from the spec, the slowest live rank's step time, and
// while it runs, rank 0's MFU where its trainer knows its device's peak. `spec`: the job's,
// nullptr when it no longer parses (as for each helper below).
std::string Progress(const v1::JobInfo& info, const JobSpec* spec) {
  const v1::JobRecord& j = info.job();
  double step_ms = 0, mfu = 0;
  if (j.state() == v1::RUNNING) {
    for (const v1::TrainerStatus& t : info.trainers()) {
      if (t.attempt() == j.attempt() && t.state() == v1::TRAINER_RUNNING) {
        step_ms = std::max(step_ms, t.progress().step_ms());
        if (t.rank() == 0) mfu = t.progress().mfu();
      }
    }
  }
  return FormatProgress(j.last_step(), spec ? spec->train.steps : 0, step_ms, j.tokens_per_s(),
                        j.furthest_step(), mfu);
}

// The current attempt's mesh, as its trainers derive it from the spec and the world size
// ("dp2 x pp1 x tp1, ZeRO-1, 2 micro-batches per step": an elastic job's layout and
// accumulation change with its size); empty while it has no placement.
std::string Layout(const v1::JobRecord& j, const JobSpec* spec) {
  if (j.placement_size() == 0 || !spec) return "";
  auto mesh = ParallelMesh::Create(*spec, j.placement_size());
  return mesh.ok() ? mesh->Describe() : "";
}

// "2h00m, 1h12m used": the job's time limit and how much of it its attempts have run;
// empty for a job without one.
std::string TimeLimit(const v1::JobInfo& info, const JobSpec* spec) {
  if (!spec || spec->resources.time_limit_minutes <= 0) return "";
  const int64_t ran_ms = JobRanMs(info, SystemClock::Get()->WallNowMs());
  return FormatTimeLimit(spec->resources.time_limit_minutes) + ", " + FormatDurationMs(ran_ms) +
         " used";
}

void PrintJob(const v1::JobInfo& info) {
  const v1::JobRecord& j = info.job();
  const StatusOr<JobSpec> parsed = ParseJobSpec(j.spec_yaml(), {}, "job " + j.job_id());
  const JobSpec* spec = parsed.ok() ? &*parsed : nullptr;
  std::cout << "job:         " << j.job_id() << " (" << j.name() << ")\n"
            << "state:       " << JobStateName(j.state())
            << (j.reason().empty() ? "" : " - " + j.reason()) << "\n"
            << "attempt:     " << j.attempt() << "   restarts: " << j.restarts() << "/"
            << j.max_restarts() << "\n";
  if (const std::string limit = TimeLimit(info, spec); !limit.empty()) {
    std::cout << "time limit:  " << limit << "\n";
  }
  if (const std::string layout = Layout(j, spec); !layout.empty()) {
    std::cout << "layout:      " << layout << "\n";
  }
  std::cout << "progress:    " << Progress(info, spec) << "   loss: " << j.last_loss() << "\n"
            << "checkpoint:  "
            << (j.latest_checkpoint_step() >= 0 ? std::to_string(j.latest_checkpoint_step())
                                                : std::string("none"))
            << (j.checkpoint_error().empty() ? "" : "   LAST SAVE FAILED: " + j.checkpoint_error())
            << "\n"
            << "output_dir:  " << j.output_dir() << "\n";
  if (j.rollbacks() > 0) std::cout << "rollbacks:   " << j.rollbacks() << " (loss spikes)\n";
  for (const std::string& notice : info.notices()) std::cout << "notice:      " << notice << "\n";
  if (!info.attempts().empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const v1::AttemptRecord& a : info.attempts()) {
      int64_t end = a.ended_ms() > 0 ? a.ended_ms() : 0;
      rows.push_back({std::to_string(a.attempt()), std::to_string(a.world_size()),
                      a.resume_step() >= 0 ? std::to_string(a.resume_step()) : "-",
                      end > 0 ? FormatDurationMs(end - a.started_ms()) : "running",
                      a.end_reason()});
    }
    std::cout << "\n" << FormatTable({"ATTEMPT", "WORLD", "RESUMED", "DURATION", "END"}, rows);
  }
  if (!info.trainers().empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const v1::TrainerStatus& t : info.trainers()) {
      std::string state = v1::TrainerState_Name(t.state());
      if (state.rfind("TRAINER_", 0) == 0) state = state.substr(8);
      char loss[32];
      snprintf(loss, sizeof(loss), "%.4f", t.progress().loss());
      // The rank's own time a step, without its peer waits ("-" until it has a few steps).
      const double busy = t.progress().busy_ms();
      rows.push_back({std::to_string(t.rank()), std::to_string(t.pid()), state,
                      std::to_string(t.progress().step()), loss,
                      std::to_string(static_cast<int64_t>(t.progress().step_ms())),
                      busy > 0 ? std::to_string(static_cast<int64_t>(busy)) : "-"});
    }
    std::cout << "\n"
              << FormatTable({"RANK", "PID", "STATE", "STEP", "LOSS", "STEP_MS", "BUSY_MS"}, rows);
  }
}

CommandRun SetupStatus(CLI::App* app, GlobalOptions* globals) {
  auto job = std::make_shared<std::string>();
  app->add_option("job", *job, "job id")->required();
  app->add_flag("--json", globals->json, "protobuf JSON for scripts");
  return [job, globals]() -> int {
    RpcClient client(*globals);
    auto info = client.GetJob(*job);
    if (!info.ok()) return ReportError(info.status());
    if (globals->json) {
      std::cout << ToJson(*info);
    } else {
      PrintJob(*info);
    }
    return kExitOk;
  };
}

}  // namespace

DROVER_REGISTER_COMMAND("status", "Show one job", SetupStatus);

}  // namespace drover::cli
