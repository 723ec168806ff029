// The job list with a long history: N jobs in the JobManager (default 100,000, most of them
// finished, as on a cluster that has run for months), and the time of one `drover jobs`
// page (the newest 20 and 100) and the reply's size, and of what walks the live jobs only (a
// filter by a live state, the scheduler's pending list, the counts by state), which took 42 ms
// each while they walked the whole history. Compare with the gRPC limit (4 MiB): the reply of
// a page carries summaries without specs, so it does not grow with the history.
//
//   bench_jobs_list_bench [--jobs 100000]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "common/clock.h"
#include "coordinator/job_manager.h"

using drover::coordinator::JobManager;

namespace {

double TimeMs(const std::function<void()>& f, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         reps;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_jobs_list_bench: one page of `drover jobs` over a long history"};
  int n = 100000;
  app.add_option("--jobs", n, "jobs in the history")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  drover::FakeClock clock;
  JobManager jobs(&clock, {}, {});
  // A realistic spec of about 1 KiB: every record in the state carries one.
  const std::string spec =
      "name: bench\noutput_dir: /runs/bench\nmodel: {n_layer: 12, n_head: 12, n_embd: 768, "
      "block_size: 1024}\n"
      "data: {train: /data/train_*.bin, val: /data/val.bin}\n"
      "train: {steps: 5000, global_batch: 512, micro_batch: 16, seq_len: 1024, lr: 6.0e-4}\n"
      "resources: {world_size: {min: 8, max: 8}}\n# " +
      std::string(700, '.') + "\n";
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; i <= n; ++i) {
    auto job = jobs.PrepareSubmit(spec, 0, "j-" + std::to_string(i), i);
    if (!job.ok()) {
      std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
      return 1;
    }
    jobs.Add(std::move(*job));
  }
  // All but the newest 10 finished (cancelled), as on a cluster that has run for months.
  for (int i = 1; i <= n - 10; ++i) jobs.ApplyCancel(jobs.PlanCancel("j-" + std::to_string(i)));
  const double fill_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  drover::v1::ListJobsRequest page20, page100, running;
  page20.set_limit(20);
  page100.set_limit(100);
  running.add_states(drover::v1::RUNNING);  // none: walks every job
  drover::v1::ListJobsResponse r;
  const double ms20 = TimeMs([&] { r = jobs.ListPage(page20); }, 200);
  const double ms100 = TimeMs([&] { r = jobs.ListPage(page100); }, 200);
  const size_t bytes100 = r.ByteSizeLong();
  const double ms_scan = TimeMs([&] { r = jobs.ListPage(running); }, 5);
  drover::v1::ListJobsRequest cancelled;
  cancelled.add_states(drover::v1::CANCELLED);
  cancelled.set_limit(20);
  const double ms_cancelled = TimeMs([&] { r = jobs.ListPage(cancelled); }, 200);
  size_t pending = 0;
  const double ms_pending = TimeMs([&] { pending = jobs.Pending().size(); }, 20);
  const double ms_counts = TimeMs([&] { (void)jobs.CountByState(); }, 20);
  std::printf("%d jobs in the history (added in %.1f s)\n", n, fill_s);
  std::printf("newest 20:  %8.3f ms\n", ms20);
  std::printf("newest 100: %8.3f ms, reply %zu bytes\n", ms100, bytes100);
  std::printf("RUNNING jobs (none; a walk of the live jobs only): %8.3f ms\n", ms_scan);
  std::printf("newest 20 CANCELLED:  %8.3f ms\n", ms_cancelled);
  std::printf("the scheduler's pending jobs (%zu): %8.3f ms\n", pending, ms_pending);
  std::printf("jobs by state (the dashboard and /metrics): %8.3f ms\n", ms_counts);
  std::printf("(before pages, one reply carried every record with its spec: about %.1f MiB)\n",
              n * (spec.size() + 100) / 1048576.0);
  return 0;
}
