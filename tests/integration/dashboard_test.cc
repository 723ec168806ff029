// The dashboard in a real browser: a coordinator serving --http, two agents running the
// scripted trainer, a job that crashes once and recovers, and headless Chromium (Debian's
// `chromium`) loading the page. The test checks the DOM the page rendered (the job, the
// nodes, the attempts, the charts' SVG paths) and keeps a screenshot as an artifact:
// <build>/test-artifacts/dashboard.png (and the DOM beside it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <string>

#include "tests/integration/cluster.h"

namespace drover::testing {
namespace {

using ::testing::HasSubstr;

std::string Chromium() {
  for (const char* exe : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (access(exe, X_OK) == 0) return exe;
  }
  return "";
}

std::filesystem::path Artifacts() {
#ifdef DROVER_BIN_DIR
  std::filesystem::path dir = std::filesystem::path(DROVER_BIN_DIR) / "test-artifacts";
#else
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "drover-test-artifacts";
#endif
  std::filesystem::create_directories(dir);
  return dir;
}

// Runs headless Chromium on `url` with `what` (--dump-dom, --screenshot=...); stdout goes
// to `out`. Virtual time lets the page's first poll finish and render before the dump;
// `timeout` bounds a browser that never returns.
int RunChromium(const std::string& chromium, const std::filesystem::path& profile,
                const std::string& url, const std::string& what, const std::string& out,
                const std::string& log) {
  const std::string cmd = "timeout 120 " + chromium +
                          " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage"
                          " --no-first-run --hide-scrollbars --window-size=1400,1000"
                          " --virtual-time-budget=8000 --user-data-dir='" +
                          profile.string() + "' " + what + " '" + url + "' > '" + out + "' 2>> '" +
                          log + "'";
  return std::system(cmd.c_str());
}

TEST(DashboardTest, ChromiumShowsTheClusterAJobItsRecoveryAndLiveCharts) {
  const std::string chromium = Chromium();
  ASSERT_FALSE(chromium.empty())
      << "chromium not found: the dashboard test needs Debian's `chromium` package "
         "(deploy/install-deps.sh installs it; `make test` runs that)";
  ASSERT_EQ(std::system("command -v promtool >/dev/null 2>&1"), 0)
      << "promtool not found: install Debian's `prometheus` package (deploy/install-deps.sh)";

  const int http_port = FreePort();
  ClusterOptions options;
  options.name = "dashboard";
  options.agents = 2;
  options.coordinator_args = {"--http", "127.0.0.1:" + std::to_string(http_port)};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();

  // Two ranks; rank 0 of attempt 1 crashes at step 25, attempt 2 resumes from step 20.
  std::string yaml = cluster.JobYaml("dash-demo", 2, 2, 5000, 10, 3, 60,
                                     "step_ms=40\ncrash_at_step=25\nmfu=0.31\nhellaswag=1\n");
  yaml = std::regex_replace(yaml, std::regex("eval_every: 0"), "eval_every: 5");
  // A limit it never reaches: the page shows it and the time used.
  yaml = std::regex_replace(yaml, std::regex("  device: cpu\n"),
                            "  device: cpu\n  time_limit_minutes: 600\n");
  auto id = cluster.Submit(yaml);
  ASSERT_TRUE(id.ok()) << id.status();
  v1::JobInfo info;
  ASSERT_TRUE(cluster.WaitJob(
      *id,
      [](const v1::JobInfo& j) {
        return j.job().attempt() >= 2 && j.job().state() == v1::RUNNING &&
               j.job().last_step() >= 40;
      },
      60000, &info))
      << info.DebugString() << cluster.DebugLogs();

  // /metrics from the live coordinator passes Prometheus's own checker.
  httplib::Client http("127.0.0.1", http_port);
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  ASSERT_EQ(metrics->status, 200);
  const std::filesystem::path dir = cluster.root();
  std::ofstream(dir / "metrics.txt") << metrics->body;
  const std::string promtool_out = (dir / "promtool.out").string();
  const int rc = std::system(("promtool check metrics < '" + (dir / "metrics.txt").string() +
                              "' > '" + promtool_out + "' 2>&1")
                                 .c_str());
  EXPECT_EQ(rc, 0) << ReadAll(promtool_out) << "\n" << metrics->body;
  EXPECT_THAT(metrics->body, HasSubstr("drover_job_recovery_seconds_count 1"));
  EXPECT_THAT(metrics->body,
              HasSubstr("drover_job_mfu_ratio{job_id=\"" + *id + "\",name=\"dash-demo\"} 0.31"));
  EXPECT_THAT(metrics->body, HasSubstr("drover_job_time_limit_seconds{job_id=\"" + *id +
                                       "\",name=\"dash-demo\"} 36000"));
  EXPECT_THAT(metrics->body, HasSubstr("method=\"WorkerService/Heartbeat\""));

  // The page, rendered by a real browser.
  const std::string url = "http://127.0.0.1:" + std::to_string(http_port) + "/#job=" + *id;
  const std::filesystem::path artifacts = Artifacts();
  const std::string dom_path = (artifacts / "dashboard.html").string();
  const std::string log = (dir / "chromium.log").string();
  ASSERT_EQ(RunChromium(chromium, dir / "profile", url, "--dump-dom", dom_path, log), 0)
      << ReadAll(log);
  const std::string dom = ReadAll(dom_path);
  EXPECT_THAT(dom, HasSubstr("dash-demo"));
  EXPECT_THAT(dom, HasSubstr("data-node=\"w0\""));
  EXPECT_THAT(dom, HasSubstr("data-node=\"w1\""));
  EXPECT_THAT(dom, HasSubstr("live · updated"));  // the poll succeeded
  EXPECT_THAT(dom, HasSubstr("placed "));
  EXPECT_THAT(dom, HasSubstr("training again after"));
  EXPECT_THAT(dom, HasSubstr("exited with code 4"));
  EXPECT_THAT(dom, HasSubstr("· MFU 31.0%"));  // rank 0's, beside its tokens / s
  EXPECT_THAT(dom, ::testing::ContainsRegex("time limit</span><b>[0-9.]+ s of 10 h 0 min</b>"));
  // Each chart is an SVG whose paths have points: M x,y, then L x,y for every further one.
  for (const char* chart :
       {"chart-loss", "chart-val", "chart-lr", "chart-tps", "chart-hellaswag"}) {
    const size_t begin = dom.find(std::string("<svg id=\"") + chart + "\"");
    ASSERT_NE(begin, std::string::npos) << chart << " missing\n" << dom;
    const std::string svg = dom.substr(begin, dom.find("</svg>", begin) - begin);
    const size_t path = svg.find("<path class=\"series\"");
    ASSERT_NE(path, std::string::npos) << chart << " has no series: " << svg;
    const size_t d = svg.find(" d=\"M", path);
    ASSERT_NE(d, std::string::npos) << svg;
    const std::string points = svg.substr(d + 4, svg.find('"', d + 4) - (d + 4));
    EXPECT_EQ(points.find_first_not_of("0123456789.,ML"), std::string::npos) << points;
    EXPECT_GE(std::count(points.begin(), points.end(), 'L'), 1) << chart << ": " << points;
  }
  // One line per attempt in the loss chart: attempt 2 resumed from an earlier step.
  EXPECT_THAT(dom, HasSubstr("data-attempt=\"1\""));
  EXPECT_THAT(dom, HasSubstr("data-attempt=\"2\""));
  std::cout << "dashboard DOM: " << dom_path << "\n";

  const std::filesystem::path png = artifacts / "dashboard.png";
  std::filesystem::remove(png);
  ASSERT_EQ(RunChromium(chromium, dir / "profile", url, "--screenshot=" + png.string(),
                        (dir / "screenshot.out").string(), log),
            0)
      << ReadAll(log);
  ASSERT_TRUE(std::filesystem::exists(png)) << ReadAll(log);
  const std::string image = ReadAll(png.string());
  EXPECT_EQ(image.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_GT(image.size(), 20000u);  // a rendered page, not a blank one
  std::cout << "dashboard screenshot: " << png.string() << "\n";
}

}  // namespace
}  // namespace drover::testing
