#include "coordinator/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <nlohmann/json.hpp>

#include "coordinator/coordinator.h"
#include "coordinator/dashboard/page.h"
#include "coordinator/dashboard_json.h"

namespace drover::coordinator {
namespace {

class CoordinatorSource final : public DashboardSource {
 public:
  explicit CoordinatorSource(Coordinator* c) : c_(c) {}
  v1::ListWorkersResponse ListWorkers() override { return c_->ListWorkers(); }
  v1::ListJobsResponse ListJobs(const v1::ListJobsRequest& request) override {
    return c_->ListJobs(request);
  }
  StatusOr<v1::JobInfo> GetJob(const std::string& job_id) override { return c_->GetJob(job_id); }
  std::map<v1::JobState, int64_t> CountJobsByState() override { return c_->CountJobsByState(); }
  ProgressHistory::Series JobHistory(const std::string& job_id) override {
    return c_->JobHistory(job_id);
  }
  int64_t WallNowMs() override { return c_->WallNowMs(); }

 private:
  Coordinator* const c_;
};

// Live jobs are few; the list is paged only so that one huge queue cannot make one reply.
constexpr int kPageSize = 1000;

v1::ListJobsResponse Running(DashboardSource* source) {
  v1::ListJobsRequest request;
  request.set_limit(kPageSize);
  request.add_states(v1::RUNNING);
  v1::ListJobsResponse all;
  while (true) {
    v1::ListJobsResponse page = source->ListJobs(request);
    for (auto& j : *page.mutable_jobs()) *all.add_jobs() = std::move(j);
    if (page.next_before_seq() == 0) return all;
    request.set_before_seq(page.next_before_seq());
  }
}

void SendJson(httplib::Response& res, const nlohmann::json& body, int status = 200) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(), "application/json");
}

void SendError(httplib::Response& res, int status, const std::string& message) {
  SendJson(res, nlohmann::json{{"error", message}}, status);
}

}  // namespace

std::unique_ptr<DashboardSource> DashboardSourceOf(Coordinator* coordinator) {
  return std::make_unique<CoordinatorSource>(coordinator);
}

ClusterSnapshot TakeSnapshot(DashboardSource* source) {
  ClusterSnapshot s;
  s.now_ms = source->WallNowMs();
  s.jobs_by_state = source->CountJobsByState();
  v1::ListWorkersResponse workers = source->ListWorkers();
  for (auto& w : *workers.mutable_workers()) s.workers.push_back(std::move(w));
  v1::ListJobsRequest request;
  request.set_limit(kPageSize);
  request.add_states(v1::RUNNING);
  request.add_states(v1::RECOVERING);
  while (true) {
    v1::ListJobsResponse page = source->ListJobs(request);
    for (const auto& j : page.jobs()) {
      // One lock per job, not one for all: a scrape never holds the state for long.
      auto info = source->GetJob(j.job_id());
      if (!info.ok()) continue;  // deleted meanwhile
      s.live_jobs.push_back(std::move(*info));
    }
    if (page.next_before_seq() == 0) break;
    request.set_before_seq(page.next_before_seq());
  }
  return s;
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(DashboardSource* source,
                                                        CoordinatorMetrics* metrics,
                                                        const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    const char* first = listen.data() + colon + 1;
    const char* last = listen.data() + listen.size();
    auto [ptr, ec] = std::from_chars(first, last, port);
    if (ec != std::errc() || ptr != last || first == last) port = -1;
  }
  if (port < 0 || port > 65535) {
    return InvalidArgumentError("--http must be host:port with a port in [0, 65535], got '" +
                                listen + "'");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->source_ = source;
  s->metrics_ = metrics;
  s->server_ = std::make_unique<httplib::Server>();
  // A dashboard has few viewers: two threads, not one per core beside the RPC threads.
  s->server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  s->server_->set_read_timeout(5, 0);
  s->server_->set_write_timeout(5, 0);
  s->Route();
  if (port == 0) {
    s->port_ = s->server_->bind_to_any_port(host);
  } else if (s->server_->bind_to_port(host, port)) {
    s->port_ = port;
  }
  if (s->port_ <= 0) {
    return UnavailableError("cannot serve HTTP on " + listen + " (address in use or invalid)");
  }
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  // stop() only stops a server that is running: wait for it, so Shutdown never misses it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!raw->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  spdlog::info("dashboard and metrics on http://{}:{}/", host, s->port_);
  return s;
}

HttpServer::~HttpServer() { Shutdown(); }

void HttpServer::Shutdown() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

void HttpServer::Route() {
  httplib::Server& svr = *server_;
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    // The page fetches nothing from elsewhere; the policy makes the browser hold it to that.
    res.set_header("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "connect-src 'self'; img-src 'self' data:");
    const std::string_view page = DashboardPage();
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->Render(TakeSnapshot(source_)),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  svr.Get("/api/cluster", [this](const httplib::Request&, httplib::Response& res) {
    const int64_t now = source_->WallNowMs();
    v1::ListWorkersResponse workers = source_->ListWorkers();
    SendJson(res, ClusterJson(workers, Running(source_), now));
  });
  svr.Get("/api/jobs", [this](const httplib::Request& req, httplib::Response& res) {
    v1::ListJobsRequest request;
    if (req.has_param("limit")) {
      const std::string v = req.get_param_value("limit");
      int limit = 0;
      auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), limit);
      if (ec != std::errc() || ptr != v.data() + v.size() || limit < 1 || limit > kPageSize) {
        SendError(
            res, 400,
            "limit must be an integer in [1, " + std::to_string(kPageSize) + "], got '" + v + "'");
        return;
      }
      request.set_limit(limit);
    }
    SendJson(res, JobsJson(source_->ListJobs(request)));
  });
  svr.Get(R"(/api/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    auto info = source_->GetJob(id);
    if (!info.ok()) {
      SendError(res, info.status().code() == StatusCode::kNotFound ? 404 : 500,
                info.status().message());
      return;
    }
    SendJson(res, JobJson(*info, source_->JobHistory(id), source_->WallNowMs()));
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    res.set_content(std::to_string(res.status) + ": nothing at " + req.path +
                        " (try /, /metrics, /api/cluster, /api/jobs, /api/jobs/ID)\n",
                    "text/plain");
  });
  svr.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::warn("http {}: {}", req.path, what);
        SendError(res, 500, what);
      });
}

}  // namespace drover::coordinator
