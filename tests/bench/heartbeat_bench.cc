// Heartbeat load on one coordinator: N simulated agents, each heartbeating once a second
// (phases spread evenly), from a few client threads with async stubs.
//
// How CPU is measured: the coordinator runs in a child process of this binary (forked
// before gRPC starts in either process), so its CPU time is exactly the child's
// utime + stime from /proc/<pid>/stat over the measured window, with no client work mixed
// in. Latency is per heartbeat RPC, send to completion, as the client sees it.
//
//   bench_heartbeat_bench [--agents 1000,10000] [--seconds 10] [--threads 4]
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "proto/drover.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = drover::v1;

// Child: serve until killed; report the port through `fd`.
[[noreturn]] void RunCoordinator(const std::string& state_dir, int fd) {
  spdlog::set_level(spdlog::level::warn);  // one info line per registration would dominate
  drover::coordinator::CoordinatorOptions options;
  options.state_dir = state_dir;
  // Registering 10,000 agents takes longer than the default 3 s timeout on a small
  // machine; a long timeout keeps early registrants from dying before the load starts
  // (it changes nothing in how a heartbeat is handled).
  options.heartbeat_timeout_ms = 600'000;
  auto c = drover::coordinator::Coordinator::Open(options, drover::SystemClock::Get());
  if (!c.ok()) _exit(3);
  auto server = drover::coordinator::CoordinatorServer::Start(c->get(), "127.0.0.1:0");
  if (!server.ok()) _exit(4);
  int port = (*server)->port();
  if (write(fd, &port, sizeof(port)) != sizeof(port)) _exit(5);
  close(fd);
  pause();
  _exit(0);
}

double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the ")" closing the command name: state is field 3; utime 14, stime 15.
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Call {
  grpc::ClientContext ctx;
  v1::HeartbeatResponse resp;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatResponse>> reader;
  Clock::time_point sent;
  bool measured = false;
};

struct ThreadResult {
  std::vector<int64_t> latency_us;
  int64_t errors = 0;
  int64_t reregister = 0;
};

// Heartbeats for agents [first, first + count) until `end`; measures those sent after
// `measure_from`.
void RunClients(const std::string& address, int first, int count, Clock::time_point start,
                Clock::time_point measure_from, Clock::time_point end, ThreadResult* out) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::WorkerService::NewStub(channel);
  grpc::CompletionQueue cq;
  int64_t sent = 0, in_flight = 0;
  auto due = [&](int64_t n) {
    return start +
           std::chrono::microseconds((n / count) * 1'000'000 + (n % count) * 1'000'000 / count);
  };
  while (true) {
    auto now = Clock::now();
    while (now < end && due(sent) <= now) {
      const int agent = first + static_cast<int>(sent % count);
      v1::HeartbeatRequest req;
      req.set_name("node-" + std::to_string(agent));
      req.set_agent_id("agent-" + std::to_string(agent));
      req.set_seq(sent / count);
      auto* call = new Call;
      call->sent = Clock::now();
      call->measured = call->sent >= measure_from;
      call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      call->reader = stub->AsyncHeartbeat(&call->ctx, req, &cq);
      call->reader->Finish(&call->resp, &call->status, call);
      ++sent;
      ++in_flight;
    }
    if (now >= end && in_flight == 0) break;
    void* tag;
    bool ok;
    auto deadline = std::min(due(sent), Clock::now() + std::chrono::milliseconds(2));
    if (cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + (deadline - Clock::now())) ==
        grpc::CompletionQueue::GOT_EVENT) {
      auto* call = static_cast<Call*>(tag);
      --in_flight;
      if (call->measured) {
        out->latency_us.push_back(
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - call->sent)
                .count());
        if (!ok || !call->status.ok()) ++out->errors;
        if (call->resp.reregister()) ++out->reregister;
      }
      delete call;
    }
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) delete static_cast<Call*>(tag);
}

int RunOne(int agents, int seconds, int threads) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/drover_hb_bench_" +
                          std::to_string(getpid()) + "_" + std::to_string(agents);
  std::filesystem::remove_all(dir);
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the benchmark
    close(fds[0]);
    RunCoordinator(dir, fds[1]);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) {
    std::fprintf(stderr, "coordinator failed to start\n");
    return 1;
  }
  close(fds[0]);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  {  // Register every agent (sync, a few threads).
    std::vector<std::thread> regs;
    const int reg_threads = 32;  // sync calls: many in flight hide the round trips
    for (int t = 0; t < reg_threads; ++t) {
      regs.emplace_back([&, t] {
        auto stub = v1::WorkerService::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
        for (int i = t; i < agents; i += reg_threads) {
          v1::RegisterRequest req;
          req.set_name("node-" + std::to_string(i));
          req.set_agent_id("agent-" + std::to_string(i));
          for (int s = 0; s < 8; ++s) req.add_slots()->set_index(s);
          grpc::ClientContext ctx;
          v1::RegisterResponse resp;
          grpc::Status st = stub->Register(&ctx, req, &resp);
          if (!st.ok()) std::fprintf(stderr, "register: %s\n", st.error_message().c_str());
        }
      });
    }
    for (auto& t : regs) t.join();
  }

  const int warmup_s = 2;
  auto start = Clock::now() + std::chrono::milliseconds(100);
  auto measure_from = start + std::chrono::seconds(warmup_s);
  auto end = measure_from + std::chrono::seconds(seconds);
  std::vector<ThreadResult> results(threads);
  std::vector<std::thread> clients;
  const int per = agents / threads;
  for (int t = 0; t < threads; ++t) {
    const int count = t == threads - 1 ? agents - per * t : per;
    clients.emplace_back(RunClients, address, per * t, count, start, measure_from, end,
                         &results[t]);
  }
  std::this_thread::sleep_until(measure_from);
  const double cpu0 = CpuSeconds(child);
  const auto wall0 = Clock::now();
  std::this_thread::sleep_until(end);
  const double cpu1 = CpuSeconds(child);
  const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
  for (auto& t : clients) t.join();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::filesystem::remove_all(dir);

  std::vector<int64_t> lat;
  int64_t errors = 0, rereg = 0;
  for (auto& r : results) {
    lat.insert(lat.end(), r.latency_us.begin(), r.latency_us.end());
    errors += r.errors;
    rereg += r.reregister;
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, size_t(p * lat.size()))] / 1000.0;
  };
  std::printf(
      "agents=%d heartbeats=%zu (%.0f/s) errors=%lld reregister=%lld  coordinator CPU=%.1f%% "
      "of one core  latency ms: p50=%.2f p90=%.2f p99=%.2f max=%.2f\n",
      agents, lat.size(), lat.size() / static_cast<double>(seconds), (long long)errors,
      (long long)rereg, 100.0 * (cpu1 - cpu0) / wall, pct(0.5), pct(0.9), pct(0.99),
      lat.empty() ? 0.0 : lat.back() / 1000.0);
  std::fflush(stdout);
  return errors == 0 && rereg == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"heartbeat load on one coordinator"};
  std::vector<int> agents = {1000, 10000};
  int seconds = 10, threads = 4;
  app.add_option("--agents", agents, "agent counts to run, one after the other")->delimiter(',');
  app.add_option("--seconds", seconds, "measured seconds per run")->check(CLI::Range(1, 600));
  app.add_option("--threads", threads, "client threads")->check(CLI::Range(1, 64));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  // Each agent count runs in its own child process: gRPC must not be in use in a process
  // that forks, and RunOne forks the coordinator, so this process never touches gRPC.
  int rc = 0;
  for (int n : agents) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) _exit(RunOne(n, seconds, threads));
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
