// Heartbeat load on one coordinator: N simulated agents, each heartbeating once a second
// (phases spread evenly), driven by a few client threads with async stubs.
//
// The simulation is what a cluster does to the coordinator:
// - every agent has its own TCP connection (--connections lowers that, to share them);
// - with --trainers K > 0 (the default) the cluster is busy: one job of agents x K ranks is
//   submitted, every agent starts the ranks its heartbeat replies order (it only pretends)
//   and from then lists them in every heartbeat with a moving step, as a real agent does,
//   so each heartbeat goes through trainer status, hang tracking and order computation.
//   --queued more jobs wait behind it for slots, as on a full cluster. --trainers 0
//   measures an idle cluster.
//
// How CPU is measured: the coordinator runs in a child process of this binary (forked
// before gRPC starts in either process), so its CPU time is exactly the child's
// utime + stime from /proc/<pid>/stat over the measured window, with no client work mixed
// in. --coordinator-cpus N pins it to CPUs [0, N) and the agents to the others, so on a
// small machine the agents cannot starve it (nor it them). Latency is per heartbeat RPC,
// send to completion, as the client sees it, so it includes the client's own delays.
//
//   bench_heartbeat_bench [--agents 1000,10000] [--seconds 10] [--threads 1]
//                         [--trainers 4] [--queued 10] [--coordinator-cpus 1]
//                         [--connections N]
#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/grpc_runtime.h"
#include "common/protocol_version.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "proto/drover.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = drover::v1;

struct Options {
  int seconds = 10;
  int threads = 1;
  int trainers = 4;
  int coordinator_cpus = 1;
  int connections = 0;  // 0: one per agent
  int queued = 10;
};

// Each simulated connection is a socket on both sides; lift the soft limit to the hard one.
void RaiseFdLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// Pins the calling process (and the threads it starts later) to CPUs [first, last].
void PinTo(int first, int last) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c = first; c <= last; ++c) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) std::perror("sched_setaffinity");
}

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

// Packets the kernel dropped (every CPU's backlog, /proc/net/softnet_stat column 2) and TCP
// segments it retransmitted (/proc/net/snmp). On loopback a drop costs a retransmission
// timeout (>= 200 ms) to the heartbeat that lost it, so any drop shows in the tail latency.
struct NetCounters {
  int64_t drops = 0;
  int64_t retransmits = 0;
};

NetCounters ReadNetCounters() {
  NetCounters n;
  std::ifstream softnet("/proc/net/softnet_stat");
  std::string line;
  while (std::getline(softnet, line)) {
    std::istringstream fields(line);
    std::string processed, dropped;
    if (fields >> processed >> dropped) n.drops += std::stoll(dropped, nullptr, 16);
  }
  std::ifstream snmp("/proc/net/snmp");
  std::string header;
  while (std::getline(snmp, header) && std::getline(snmp, line)) {
    if (header.rfind("Tcp:", 0) != 0) continue;
    std::istringstream names(header), values(line);
    std::string name, value;
    while (names >> name && values >> value) {
      if (name == "RetransSegs") n.retransmits = std::stoll(value);
    }
  }
  return n;
}

struct ThreadResult {
  std::vector<int64_t> latency_us;
  std::vector<int64_t> send_late_us;  // how late each measured beat was sent (agent-side)
  int64_t errors = 0;
  int64_t reregister = 0;
  int64_t register_errors = 0;
  int64_t skipped = 0;          // beats due while the agent's previous one was in flight
  int64_t trainers_listed = 0;  // in the last heartbeat of each agent
};

// The agents one client thread simulates, [first, first + count), and their connections.
// gRPC puts every channel with the same arguments on one shared connection, so a distinct
// argument per channel forces a connection each.
struct AgentSet {
  int first = 0;
  int count = 0;
  std::vector<std::unique_ptr<v1::WorkerService::Stub>> stubs;  // one per connection
  v1::WorkerService::Stub* StubOf(int i) const { return stubs[i % stubs.size()].get(); }
};

AgentSet Connect(const std::string& address, int first, int count, int connections) {
  AgentSet set{first, count, {}};
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("drover.bench.connection", first + c);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // as the agent's channel (worker/grpc_util.cc)
    set.stubs.push_back(v1::WorkerService::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
  }
  return set;
}

// Registers every agent of the set with `slots` slots, up to 256 calls in flight.
void RegisterAll(const AgentSet& set, int slots, ThreadResult* out) {
  struct Reg {
    grpc::ClientContext ctx;
    v1::RegisterResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::RegisterResponse>> reader;
  };
  grpc::CompletionQueue cq;
  int next = 0, in_flight = 0;
  while (next < set.count || in_flight > 0) {
    while (next < set.count && in_flight < 256) {
      const int agent = set.first + next;
      v1::RegisterRequest req;
      req.set_name("node-" + std::to_string(agent));
      req.set_agent_id("agent-" + std::to_string(agent));
      req.set_address("127.0.0.1:0");
      req.set_protocol_version(drover::kProtocolVersion);
      for (int s = 0; s < slots; ++s) {
        v1::Slot* slot = req.add_slots();
        slot->set_index(s);
        slot->set_device(v1::CPU);
      }
      auto* reg = new Reg;
      reg->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      reg->reader = set.StubOf(next)->AsyncRegister(&reg->ctx, req, &cq);
      reg->reader->Finish(&reg->resp, &reg->status, reg);
      ++next;
      ++in_flight;
    }
    void* tag;
    bool ok;
    if (!cq.Next(&tag, &ok)) break;
    auto* reg = static_cast<Reg*>(tag);
    if (!ok || !reg->status.ok()) {
      if (out->register_errors++ == 0) {
        std::fprintf(stderr, "register: %s\n", reg->status.error_message().c_str());
      }
    }
    delete reg;
    --in_flight;
  }
  cq.Shutdown();
}

// What the agent does with its orders: a start adds the trainer to what it lists, a stop
// removes every trainer of that job up to that attempt.
void ApplyOrders(const v1::HeartbeatResponse& resp, v1::HeartbeatRequest* agent) {
  for (const v1::Order& order : resp.orders()) {
    if (order.has_start()) {
      const v1::StartTrainerOrder& s = order.start();
      bool listed = false;
      for (const auto& t : agent->trainers()) {
        listed |= t.job_id() == s.job_id() && t.attempt() == s.attempt() && t.rank() == s.rank();
      }
      if (listed) continue;
      v1::TrainerStatus* t = agent->add_trainers();
      t->set_job_id(s.job_id());
      t->set_attempt(s.attempt());
      t->set_rank(s.rank());
      t->set_pid(10'000 + s.slot());
      t->set_state(v1::TRAINER_RUNNING);
    } else if (order.has_stop()) {
      auto* list = agent->mutable_trainers();
      for (int i = list->size() - 1; i >= 0; --i) {
        if (list->Get(i).job_id() == order.stop().job_id() &&
            list->Get(i).attempt() <= order.stop().attempt()) {
          list->DeleteSubrange(i, 1);
        }
      }
    }
  }
}

// Heartbeats for the set's agents until `end`, each once a second with phases spread
// evenly; measures those sent after `measure_from`.
void RunClients(const AgentSet& set, Clock::time_point start, Clock::time_point measure_from,
                Clock::time_point end, ThreadResult* out) {
  struct Call {
    grpc::ClientContext ctx;
    v1::HeartbeatResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatResponse>> reader;
    Clock::time_point sent;
    int agent = 0;
    bool measured = false;
  };
  const int count = set.count;
  std::vector<v1::HeartbeatRequest> agents(count);
  for (int i = 0; i < count; ++i) {
    agents[i].set_name("node-" + std::to_string(set.first + i));
    agents[i].set_agent_id("agent-" + std::to_string(set.first + i));
  }
  grpc::CompletionQueue cq;
  int64_t sent = 0, in_flight = 0;
  auto due = [&](int64_t n) {
    return start +
           std::chrono::microseconds((n / count) * 1'000'000 + (n % count) * 1'000'000 / count);
  };
  // Like a real agent, one heartbeat at a time: a beat that comes due while the previous
  // one is still in flight is skipped (and counted), so a slow coordinator is seen as late
  // and skipped beats rather than as an ever-growing client-side queue.
  std::vector<char> busy(count, 0);
  while (true) {
    auto now = Clock::now();
    while (now < end && due(sent) <= now) {
      const int i = static_cast<int>(sent % count);
      if (busy[i]) {
        if (due(sent) >= measure_from) ++out->skipped;
        ++sent;
        continue;
      }
      busy[i] = 1;
      v1::HeartbeatRequest& req = agents[i];
      req.set_seq(sent / count);
      for (auto& t : *req.mutable_trainers()) t.mutable_progress()->set_step(sent / count);
      auto* call = new Call;
      call->agent = i;
      call->sent = Clock::now();
      call->measured = call->sent >= measure_from;
      if (call->measured) {
        out->send_late_us.push_back(
            std::chrono::duration_cast<std::chrono::microseconds>(call->sent - due(sent)).count());
      }
      // The agent's RPC timeout (worker/agent.h).
      call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      // The request is serialized here, so the agent may change it before the reply.
      call->reader = set.StubOf(i)->AsyncHeartbeat(&call->ctx, req, &cq);
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
      busy[call->agent] = 0;
      if (ok && call->status.ok()) ApplyOrders(call->resp, &agents[call->agent]);
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
  for (const auto& a : agents) out->trainers_listed += a.trainers_size();
}

// A job of `world_size` ranks; the first one fills the busy cluster, one per slot.
std::string SubmitJob(const std::string& address, int world_size) {
  const std::string ws = std::to_string(world_size);
  const std::string spec = R"(name: heartbeat-bench
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 256}
data: {train: data/bench/train_*.bin}
train: {steps: 1000000, global_batch: )" +
                           ws +
                           R"(, micro_batch: 1, seq_len: 32}
resources: {world_size: {min: )" +
                           ws + ", max: " + ws + R"(}}
fault_tolerance: {hang_timeout_s: 600}
)";
  auto stub =
      v1::JobService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  req.set_spec_yaml(spec);
  v1::SubmitJobResponse resp;
  grpc::Status st = stub->SubmitJob(&ctx, req, &resp);
  if (!st.ok()) {
    std::fprintf(stderr, "submit: %s\n", st.error_message().c_str());
    return "";
  }
  return resp.job_id();
}

int RunOne(int agents, const Options& o) {
  const std::string dir = std::filesystem::temp_directory_path().string() + "/drover_hb_bench_" +
                          std::to_string(getpid()) + "_" + std::to_string(agents);
  std::filesystem::remove_all(dir);
  RaiseFdLimit();
  int fds[2];
  if (pipe(fds) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the benchmark
    close(fds[0]);
    if (o.coordinator_cpus > 0) PinTo(0, o.coordinator_cpus - 1);
    RunCoordinator(dir, fds[1]);
  }
  close(fds[1]);
  const int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  if (o.coordinator_cpus > 0) PinTo(o.coordinator_cpus, ncpu - 1);
  drover::TuneGrpcRuntime();  // as the real agent's channels do (worker/grpc_util.cc)
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) {
    std::fprintf(stderr, "coordinator failed to start\n");
    return 1;
  }
  close(fds[0]);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  const int threads = std::min(o.threads, agents);
  const int connections = o.connections > 0 ? std::min(o.connections, agents) : agents;
  std::vector<AgentSet> sets;
  std::vector<ThreadResult> results(threads);
  const int per = agents / threads;
  for (int t = 0; t < threads; ++t) {
    const int count = t == threads - 1 ? agents - per * t : per;
    const int conns = std::max(1, connections * count / agents);
    sets.push_back(Connect(address, per * t, count, conns));
  }
  const auto reg0 = Clock::now();
  {
    std::vector<std::thread> regs;
    for (int t = 0; t < threads; ++t) {
      regs.emplace_back(RegisterAll, std::cref(sets[t]), std::max(1, o.trainers), &results[t]);
    }
    for (auto& t : regs) t.join();
  }
  const double reg_s = std::chrono::duration<double>(Clock::now() - reg0).count();
  int64_t register_errors = 0;
  for (auto& r : results) register_errors += r.register_errors;
  std::string job_id;
  if (o.trainers > 0) {
    if ((job_id = SubmitJob(address, agents * o.trainers)).empty()) return 1;
    // Jobs queued behind it keep the scheduler busy, as on a full cluster.
    for (int q = 0; q < o.queued; ++q) {
      if (SubmitJob(address, o.trainers).empty()) return 1;
    }
  }

  // The first (warm-up) seconds deliver the start orders; the measured ones see every
  // agent listing its trainers.
  const int warmup_s = 3;
  auto start = Clock::now() + std::chrono::milliseconds(100);
  auto measure_from = start + std::chrono::seconds(warmup_s);
  auto end = measure_from + std::chrono::seconds(o.seconds);
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t) {
    clients.emplace_back(RunClients, std::cref(sets[t]), start, measure_from, end, &results[t]);
  }
  std::this_thread::sleep_until(measure_from);
  const double cpu0 = CpuSeconds(child);
  const double agents_cpu0 = CpuSeconds(getpid());
  const NetCounters net0 = ReadNetCounters();
  const auto wall0 = Clock::now();
  std::this_thread::sleep_until(end);
  const double cpu1 = CpuSeconds(child);
  const double agents_cpu1 = CpuSeconds(getpid());
  const NetCounters net1 = ReadNetCounters();
  const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
  for (auto& t : clients) t.join();
  if (!job_id.empty()) {  // say why, if the job is not running
    auto stub =
        v1::JobService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(job_id);
    v1::JobInfo info;
    if (stub->GetJob(&ctx, req, &info).ok() && info.job().state() != v1::RUNNING) {
      std::fprintf(stderr, "job %s is %s: %s\n", job_id.c_str(),
                   v1::JobState_Name(info.job().state()).c_str(), info.job().reason().c_str());
    }
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  std::filesystem::remove_all(dir);

  std::vector<int64_t> lat, late;
  int64_t errors = 0, rereg = 0, listed = 0, skipped = 0;
  for (auto& r : results) {
    skipped += r.skipped;
    lat.insert(lat.end(), r.latency_us.begin(), r.latency_us.end());
    late.insert(late.end(), r.send_late_us.begin(), r.send_late_us.end());
    errors += r.errors;
    rereg += r.reregister;
    listed += r.trainers_listed;
  }
  std::sort(lat.begin(), lat.end());
  std::sort(late.begin(), late.end());
  auto pct_of = [](const std::vector<int64_t>& v, double p) {
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, size_t(p * v.size()))] / 1000.0;
  };
  auto pct = [&](double p) { return pct_of(lat, p); };
  const double coord_cpu = 100.0 * (cpu1 - cpu0) / wall;
  std::printf(
      "agents=%d connections=%d trainers=%lld/%d registered in %.1f s  heartbeats=%zu "
      "(%.0f/s) errors=%lld skipped=%lld reregister=%lld\n"
      "  coordinator CPU=%.1f%% of one core (agents %.0f%%)  latency ms: p50=%.2f p90=%.2f "
      "p99=%.2f max=%.2f  target (<100%% CPU, p99<20 ms): %s\n",
      agents, connections, (long long)listed, agents * o.trainers, reg_s, lat.size(),
      lat.size() / static_cast<double>(o.seconds), (long long)errors, (long long)skipped,
      (long long)rereg, coord_cpu, 100.0 * (agents_cpu1 - agents_cpu0) / wall, pct(0.5), pct(0.9),
      pct(0.99), lat.empty() ? 0.0 : lat.back() / 1000.0,
      coord_cpu < 100.0 && pct(0.99) < 20.0 && errors == 0 && skipped == 0 ? "met" : "NOT met");
  // When the agents' own thread falls behind, their beats leave late and their replies are
  // read late: both inflate the latency above without the coordinator being slow.
  std::printf("  agents sent their beats late by p50=%.2f p99=%.2f max=%.2f ms\n",
              pct_of(late, 0.5), pct_of(late, 0.99), late.empty() ? 0.0 : late.back() / 1000.0);
  const int64_t drops = net1.drops - net0.drops;
  const int64_t retransmits = net1.retransmits - net0.retransmits;
  if (drops > 0 || retransmits > 0) {
    std::printf(
        "  the kernel dropped %lld packets and retransmitted %lld TCP segments in the window: "
        "the loopback backlog overflowed (net.core.netdev_max_backlog), which delays those "
        "heartbeats by a retransmission timeout; raise it to measure the coordinator alone\n",
        (long long)drops, (long long)retransmits);
  }
  std::fflush(stdout);
  const bool all_listed = listed == int64_t{agents} * o.trainers;
  if (!all_listed)
    std::fprintf(stderr, "not every agent lists its trainers: the job did not run\n");
  return errors == 0 && skipped == 0 && rereg == 0 && register_errors == 0 && all_listed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"heartbeat load on one coordinator"};
  std::vector<int> agents = {1000, 10000};
  Options o;
  app.add_option("--agents", agents, "agent counts to run, one after the other")->delimiter(',');
  app.add_option("--seconds", o.seconds, "measured seconds per run")->check(CLI::Range(1, 600));
  app.add_option("--threads", o.threads, "client threads")->check(CLI::Range(1, 64));
  app.add_option("--trainers", o.trainers,
                 "trainers per agent, all ranks of one job (0: an idle cluster)")
      ->check(CLI::Range(0, 64));
  app.add_option("--queued", o.queued,
                 "jobs waiting behind the cluster's job (with --trainers > 0)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--coordinator-cpus", o.coordinator_cpus,
                 "pin the coordinator to CPUs [0, N) and the agents to the rest (0: no pinning)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--connections", o.connections,
                 "TCP connections the agents share (0: one per agent, as in a cluster)")
      ->check(CLI::Range(0, 1 << 20));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (o.coordinator_cpus >= ncpu) {
    std::fprintf(stderr, "--coordinator-cpus %d leaves none of the %ld CPUs for the agents\n",
                 o.coordinator_cpus, ncpu);
    return 2;
  }
  // Each agent count runs in its own child process: gRPC must not be in use in a process
  // that forks, and RunOne forks the coordinator, so this process never touches gRPC.
  int rc = 0;
  for (int n : agents) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) _exit(RunOne(n, o));
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}
