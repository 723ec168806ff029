// HttpServer: the coordinator's read-only HTTP side (`drover-coordinator --http`), off the
// gRPC port:
//
//   /             the dashboard: one self-contained page (coordinator/dashboard/), no
//                 external script, style or font, that polls the JSON below
//   /metrics      Prometheus text format (coordinator/metrics.h)
//   /api/cluster  /api/jobs[?limit=N]  /api/jobs/ID   (coordinator/dashboard_json.h)
//
// It reads the coordinator only through DashboardSource, whose calls each take a snapshot
// under the coordinator's state lock and return: a slow browser never holds that lock,
// and nothing here writes state. Requests are served by a small pool of its own threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "coordinator/metrics.h"
#include "coordinator/progress_history.h"
#include "proto/drover.pb.h"

namespace httplib {
class Server;
}

namespace drover::coordinator {

class Coordinator;

// What the HTTP side may read. Every call returns a copy; implementations are thread-safe.
class DashboardSource {
 public:
  virtual ~DashboardSource() = default;
  virtual v1::ListWorkersResponse ListWorkers() = 0;
  virtual v1::ListJobsResponse ListJobs(const v1::ListJobsRequest& request) = 0;
  virtual StatusOr<v1::JobInfo> GetJob(const std::string& job_id) = 0;
  virtual std::map<v1::JobState, int64_t> CountJobsByState() = 0;
  virtual ProgressHistory::Series JobHistory(const std::string& job_id) = 0;
  virtual int64_t WallNowMs() = 0;
};

// The coordinator as a DashboardSource; `coordinator` must outlive it.
std::unique_ptr<DashboardSource> DashboardSourceOf(Coordinator* coordinator);

// The snapshot /metrics renders: counts, nodes, and every RUNNING or RECOVERING job.
ClusterSnapshot TakeSnapshot(DashboardSource* source);

class HttpServer {
 public:
  // Binds `listen` (host:port; port 0 picks a free one) and serves. `source` and `metrics`
  // must outlive the server. InvalidArgument for a malformed address, Unavailable when it
  // cannot be bound.
  static StatusOr<std::unique_ptr<HttpServer>> Start(DashboardSource* source,
                                                     CoordinatorMetrics* metrics,
                                                     const std::string& listen);
  ~HttpServer();  // Shutdown()

  int port() const { return port_; }
  // Stops accepting, finishes the requests in flight, joins the thread. Idempotent.
  void Shutdown();

 private:
  HttpServer() = default;
  void Route();

  DashboardSource* source_ = nullptr;
  CoordinatorMetrics* metrics_ = nullptr;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace drover::coordinator
