// A drover cluster on loopback for tests and measurements: one coordinator process, N
// worker agents running the scripted trainer (tests/tools/fake_trainer.cc), a JobService
// client and bounded waits on conditions.
//
// Every process is started with worker/process.h (own process group, PR_SET_PDEATHSIG to
// the starting thread) and killed with its group by the destructor, so nothing outlives a
// failed test. Start the cluster from the thread that runs the test.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/drover.grpc.pb.h"
#include "worker/grpc_util.h"
#include "worker/process.h"

namespace drover::testing {

inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Polls `cond` every `poll_ms` until it holds or `timeout_ms` passes.
inline bool WaitUntil(const std::function<bool()>& cond, int64_t timeout_ms, int poll_ms = 20) {
  const int64_t deadline = NowMs() + timeout_ms;
  while (true) {
    if (cond()) return true;
    if (NowMs() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
}

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// True while `pid` exists and is not a zombie (an orphan waits for init to reap it, which
// in a container can take a while; a zombie runs nothing).
inline bool ProcessAlive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  // Plain read(2): a process that vanishes mid-read makes it fail with ESRCH, which
  // iostreams would turn into an exception.
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  std::string stat(buf, static_cast<size_t>(n));
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One child process; killed (with its group) and reaped by the destructor.
class Process {
 public:
  Process(const std::string& exe, std::vector<std::string> args, const std::string& log,
          std::vector<std::pair<std::string, std::string>> env = {}) {
    SpawnOptions o;
    o.executable = exe;
    o.args = std::move(args);
    o.log_path = log;
    o.env = std::move(env);
    auto p = SpawnProcess(o);
    if (p.ok()) pid_ = p->pid;
  }
  ~Process() { Kill(SIGKILL); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !reaped_; }
  // Signals the whole process group; SIGKILL also reaps.
  void Kill(int sig) {
    if (!running()) return;
    killpg(pid_, sig);
    if (sig == SIGKILL) Wait(5000);
  }
  // Reaps the process; false when it is still running after `timeout_ms`.
  bool Wait(int64_t timeout_ms, int* wait_status = nullptr) {
    if (!running()) return true;
    int ws = 0;
    bool done = WaitUntil([&] { return waitpid(pid_, &ws, WNOHANG) == pid_; }, timeout_ms, 5);
    if (done) {
      reaped_ = true;
      if (wait_status != nullptr) *wait_status = ws;
    }
    return done;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

struct ClusterOptions {
  int agents = 2;
  int slots_per_agent = 1;
  int heartbeat_interval_ms = 200;
  int heartbeat_timeout_ms = 1000;
  int stop_grace_ms = 500;
  int agent_stop_grace_ms = 500;
  std::string name = "cluster";
  // The program agents start per rank: the scripted trainer, or "drover-trainer".
  std::string trainer = "drover-fake-trainer";
  std::vector<std::string> coordinator_args;  // appended to the coordinator's command line
  // Added to the command line of every agent (TLS).
  std::vector<std::string> agent_flags;
  // How the test's own JobService client dials, and the token it sends.
  TlsCredentials client_tls;
  std::string client_token;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options) : options_(std::move(options)) {
    root_ = std::filesystem::temp_directory_path() /
            ("drover_it_" + std::to_string(getpid()) + "_" + options_.name);
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    port_ = FreePort();
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  ~Cluster() {
    agents_.clear();
    coordinator_.reset();
    if (std::getenv("DROVER_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(root_, ec);
    }
  }

  // The build's bin/ directory: the test binary's compile-time DROVER_BIN_DIR, else the
  // directory of the running executable (tools live in bin/ themselves).
  static std::string Bin(const std::string& name) {
#ifdef DROVER_BIN_DIR
    return std::string(DROVER_BIN_DIR) + "/bin/" + name;
#else
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    return (self.parent_path() / name).string();
#endif
  }

  const std::string& address() const { return address_; }
  const std::filesystem::path& root() const { return root_; }

  // `max_file_kb` > 0: no file the coordinator writes may grow past it (ulimit -f, with
  // SIGXFSZ ignored so that a write past it fails with EFBIG): a full disk for its state.
  void StartCoordinator(int64_t max_file_kb = 0) {
    stub_.reset();  // a fresh channel: no reconnect back-off left from the old coordinator
    std::vector<std::string> args = {"--listen",
                                     address_,
                                     "--state-dir",
                                     state_dir(),
                                     "--heartbeat-interval-ms",
                                     std::to_string(options_.heartbeat_interval_ms),
                                     "--heartbeat-timeout-ms",
                                     std::to_string(options_.heartbeat_timeout_ms),
                                     "--stop-grace-ms",
                                     std::to_string(options_.stop_grace_ms)};
    args.insert(args.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
    std::string exe = Bin("drover-coordinator");
    if (max_file_kb > 0) {
      args.insert(
          args.begin(),
          {"-c", "ulimit -f " + std::to_string(max_file_kb) + " && trap '' XFSZ && exec \"$@\"",
           "limited", exe});
      exe = "/bin/bash";
    }
    coordinator_ = std::make_unique<Process>(exe, std::move(args), coordinator_log());
  }
  Process* coordinator() { return coordinator_.get(); }
  std::string state_dir() const { return (root_ / "state").string(); }
  std::string coordinator_log() const { return (root_ / "coordinator.log").string(); }

  // Appended, not "w" + std::to_string(i): GCC 12 warns about that (-Wrestrict, a false
  // positive of its inlined operator+) in some test files that inline this.
  std::string AgentName(int i) const { return std::string("w").append(std::to_string(i)); }

  void StartAgent(int i) {
    std::vector<std::string> args = {
        "--coordinator",   address_,
        "--name",          AgentName(i),
        "--slots",         std::to_string(options_.slots_per_agent),
        "--device",        "cpu",
        "--work-dir",      (root_ / AgentName(i)).string(),
        "--trainer",       Bin(options_.trainer),
        "--stop-grace-ms", std::to_string(options_.agent_stop_grace_ms)};
    args.insert(args.end(), options_.agent_flags.begin(), options_.agent_flags.end());
    agents_[AgentName(i)] = std::make_unique<Process>(Bin("drover-worker"), std::move(args),
                                                      (root_ / (AgentName(i) + ".log")).string());
  }
  Process* agent(const std::string& name) {
    auto it = agents_.find(name);
    return it == agents_.end() ? nullptr : it->second.get();
  }

  // Starts everything and waits until every agent is registered and alive.
  bool Start(int64_t timeout_ms = 10000) {
    StartCoordinator();
    for (int i = 0; i < options_.agents; ++i) StartAgent(i);
    return WaitForAliveWorkers(options_.agents, timeout_ms);
  }

  bool WaitForAliveWorkers(int n, int64_t timeout_ms) {
    return WaitUntil(
        [&] {
          auto w = ListWorkers();
          if (!w.ok()) return false;
          int alive = 0;
          for (const auto& info : w->workers()) alive += info.node().state() == v1::NODE_ALIVE;
          return alive >= n;
        },
        timeout_ms, 50);
  }

  v1::JobService::Stub* jobs() {
    if (!stub_) stub_ = v1::JobService::NewStub(MakeChannel(address_, options_.client_tls));
    return stub_.get();
  }

  // After UNAVAILABLE the next call dials afresh, as the agent and the CLI do: a TLS
  // channel whose first try found the port closed did not recover by itself here.
  Status Redial(Status st) {
    if (st.code() == StatusCode::kUnavailable) stub_.reset();
    return st;
  }

  StatusOr<std::string> Submit(const std::string& yaml, int priority = 0) {
    v1::SubmitJobRequest req;
    req.set_spec_yaml(yaml);
    req.set_priority(priority);
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 3000);
    AddBearerToken(&ctx, options_.client_token);
    RETURN_IF_ERROR(Redial(FromGrpcStatus(jobs()->SubmitJob(&ctx, req, &resp), "SubmitJob")));
    return resp.job_id();
  }
  StatusOr<v1::JobInfo> GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::JobInfo resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 1000);
    AddBearerToken(&ctx, options_.client_token);
    RETURN_IF_ERROR(Redial(FromGrpcStatus(jobs()->GetJob(&ctx, req, &resp), "GetJob")));
    return resp;
  }
  StatusOr<v1::ListJobsResponse> ListJobs() {
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 1000);
    AddBearerToken(&ctx, options_.client_token);
    RETURN_IF_ERROR(Redial(FromGrpcStatus(jobs()->ListJobs(&ctx, req, &resp), "ListJobs")));
    return resp;
  }
  StatusOr<v1::ListWorkersResponse> ListWorkers() {
    v1::ListWorkersRequest req;
    v1::ListWorkersResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 1000);
    AddBearerToken(&ctx, options_.client_token);
    RETURN_IF_ERROR(Redial(FromGrpcStatus(jobs()->ListWorkers(&ctx, req, &resp), "ListWorkers")));
    return resp;
  }
  Status Cancel(const std::string& id) {
    v1::CancelJobRequest req;
    req.set_job_id(id);
    v1::CancelJobResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 3000);
    AddBearerToken(&ctx, options_.client_token);
    return Redial(FromGrpcStatus(jobs()->CancelJob(&ctx, req, &resp), "CancelJob"));
  }

  // Waits for `pred` on the job's info; the last info seen is left in `last`.
  bool WaitJob(const std::string& id, const std::function<bool(const v1::JobInfo&)>& pred,
               int64_t timeout_ms, v1::JobInfo* last = nullptr) {
    return WaitUntil(
        [&] {
          auto info = GetJob(id);
          if (!info.ok()) return false;
          if (last != nullptr) *last = *info;
          return pred(*info);
        },
        timeout_ms, 20);
  }

  // A job spec for the fake trainer: `world` ranks, `steps` steps, a checkpoint every
  // `ckpt_every`, and `fake_conf` lines written to <output_dir>/fake_trainer.conf.
  std::string JobYaml(const std::string& name, int world_min, int world_max, int steps,
                      int ckpt_every, int max_restarts, double hang_timeout_s,
                      const std::string& fake_conf) {
    std::filesystem::path out = root_ / ("out-" + name);
    std::filesystem::create_directories(out);
    std::ofstream(out / "fake_trainer.conf") << fake_conf;
    std::ostringstream y;
    y << "name: " << name << "\n"
      << "output_dir: " << out.string() << "\n"
      << "data:\n  train: " << (root_ / "none_*.bin").string() << "\n"
      << "train:\n  steps: " << steps << "\n  global_batch: 12\n  micro_batch: 1\n"
      << "  warmup_steps: 1\n  eval_every: 0\n"
      << "resources:\n  device: cpu\n  world_size: {min: " << world_min << ", max: " << world_max
      << "}\n"
      << "checkpoint:\n  dir: " << (out / "ckpt").string() << "\n  every_steps: " << ckpt_every
      << "\n"
      << "fault_tolerance:\n  max_restarts: " << max_restarts
      << "\n  hang_timeout_s: " << hang_timeout_s << "\n";
    return y.str();
  }

  std::string DebugLogs() {
    std::string out = "---- coordinator.log (tail) ----\n" + Tail(root_ / "coordinator.log");
    for (auto& [name, p] : agents_) {
      out += "---- " + name + ".log (tail) ----\n" + Tail(root_ / (name + ".log"));
    }
    return out;
  }

 private:
  static std::string Tail(const std::filesystem::path& p) {
    std::string s = ReadAll(p.string());
    return s.size() > 3000 ? s.substr(s.size() - 3000) : s;
  }

  ClusterOptions options_;
  std::filesystem::path root_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<Process> coordinator_;
  std::map<std::string, std::unique_ptr<Process>> agents_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// Runs the `drover` CLI; returns its exit code (-1 when it hung) and combined output.
struct CliResult {
  int code = -1;
  std::string out;
};
inline CliResult RunCli(const std::filesystem::path& dir, std::vector<std::string> args,
                        std::vector<std::pair<std::string, std::string>> env = {}) {
  static int n = 0;
  const std::string log = (dir / ("cli-" + std::to_string(n++) + ".out")).string();
  CliResult r;
  {
    Process p(Cluster::Bin("drover"), std::move(args), log, std::move(env));
    int ws = 0;
    if (p.Wait(20000, &ws) && WIFEXITED(ws)) r.code = WEXITSTATUS(ws);
  }
  r.out = ReadAll(log);
  return r;
}

}  // namespace drover::testing
