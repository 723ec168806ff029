// `drover demo`: the point of drover in two minutes on one machine. Prepares a byte-level
// Shakespeare corpus, starts a coordinator and two workers on 127.0.0.1, submits a small
// GPT job, shows its progress, kills (SIGKILL) the worker that runs it partway through,
// shows the coordinator resuming the job from the newest checkpoint on the other worker,
// waits for SUCCEEDED and prints a sample from the final model. Every process it started is
// stopped when it exits, also on Ctrl-C.
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "cli/progress.h"
#include "cli/rpc_client.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/token_shard.h"
#include "worker/engine/data/tokenizer.h"
#include "worker/process.h"

namespace drover::cli {
namespace {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};
void OnInterrupt(int) { g_interrupted = true; }

struct DemoFlags {
  std::string dir;   // run directory; default: a fresh one under $TMPDIR
  std::string text;  // corpus; default: deploy/examples/data/shakespeare.txt
  std::string spec;  // default: deploy/examples/demo.yaml
  std::vector<std::string> overrides;
  int kill_at = -1;  // step; -1: 40% of train.steps
  bool no_kill = false;
  int timeout_s = 900;
};

int Fail(const std::string& msg, int code = kExitFailure) {
  std::fprintf(stderr, "drover demo: %s\n", msg.c_str());
  return code;
}

fs::path SelfDir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : self.parent_path();
}

// The first existing path among `flag` (when set) and the places a repository checkout
// or an install puts the demo files.
StatusOr<std::string> FindDemoFile(const std::string& flag, const std::string& relative) {
  if (!flag.empty()) {
    if (fs::exists(flag)) return fs::absolute(flag).string();
    return NotFoundError(flag + " does not exist");
  }
  const fs::path candidates[] = {fs::current_path() / relative,
                                 SelfDir() / ".." / ".." / relative,  // <repo>/build/bin
                                 SelfDir() / ".." / "share" / "drover" / relative};
  for (const fs::path& p : candidates) {
    if (fs::exists(p)) return fs::canonical(p).string();
  }
  return NotFoundError("cannot find " + relative +
                       " (run from the repository root, or pass its path)");
}

StatusOr<int> FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Status st = ErrnoToStatus(errno, "bind 127.0.0.1:0");
    ::close(fd);
    return st;
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

// The processes the demo started. The destructor stops every one still running: SIGTERM
// to its process group, SIGKILL after a grace period.
class Cluster {
 public:
  ~Cluster() { StopAll(); }

  Status Start(const std::string& name, SpawnOptions options) {
    auto p = SpawnProcess(options);
    if (!p.ok()) return p.status().WithContext("start " + name);
    if (p->status_fd >= 0) ::close(p->status_fd);
    procs_.push_back({name, p->pid, false});
    return OkStatus();
  }

  pid_t pid(const std::string& name) const {
    for (const Proc& p : procs_) {
      if (p.name == name) return p.pid;
    }
    return -1;
  }

  // True while `name` runs; reaps it once it has exited.
  bool Alive(const std::string& name) {
    for (Proc& p : procs_) {
      if (p.name != name || p.reaped) continue;
      int status = 0;
      if (::waitpid(p.pid, &status, WNOHANG) == p.pid) p.reaped = true;
      return !p.reaped;
    }
    return false;
  }

  void Kill(const std::string& name) {
    for (Proc& p : procs_) {
      if (p.name == name && !p.reaped) ::kill(p.pid, SIGKILL);
    }
  }

  void StopAll() {
    for (Proc& p : procs_) {
      if (!p.reaped) ::kill(-p.pid, SIGTERM);
    }
    const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
    for (Proc& p : procs_) {
      while (!p.reaped) {
        int status = 0;
        if (::waitpid(p.pid, &status, WNOHANG) != 0) {
          p.reaped = true;
        } else if (SteadyClock::now() > deadline) {
          ::kill(-p.pid, SIGKILL);
          ::waitpid(p.pid, &status, 0);
          p.reaped = true;
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
    }
  }

 private:
  struct Proc {
    std::string name;
    pid_t pid;
    bool reaped;
  };
  std::vector<Proc> procs_;
};

// Byte-level train.bin / val.bin (last 10% of the text) in `dir`.
Status PrepareData(const std::string& text_path, const fs::path& dir) {
  StatusOr<std::string> text = ReadFileToString(text_path);
  if (!text.ok()) return text.status().WithContext("cannot read the demo's text");
  std::vector<int32_t> ids = engine::MakeByteTokenizer()->Encode(*text);
  std::vector<uint16_t> tokens(ids.begin(), ids.end());
  if (tokens.size() < 10000) return InvalidArgumentError(text_path + " is too short for the demo");
  const size_t split = tokens.size() * 9 / 10;
  fs::create_directories(dir);
  RETURN_IF_ERROR(WriteTokenShard((dir / "train.bin").string(),
                                  std::span<const uint16_t>(tokens.data(), split)));
  RETURN_IF_ERROR(
      WriteTokenShard((dir / "val.bin").string(),
                      std::span<const uint16_t>(tokens.data() + split, tokens.size() - split)));
  std::printf("  data: %zu train / %zu val byte tokens from %s\n", split, tokens.size() - split,
              text_path.c_str());
  return OkStatus();
}

std::string RunDir(const std::string& flag) {
  if (!flag.empty()) return fs::absolute(flag).string();
  StatusOr<std::string> made = MakeTempDir("drover-demo-");
  return made.ok() ? *made : std::string();
}

double Since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// "demo-w1" or "demo-w1 + demo-w2": the nodes of the job's ranks, in rank order.
std::string NodesOf(const v1::JobRecord& job) {
  std::string nodes;
  for (const auto& a : job.placement()) {
    if (nodes.find(a.node()) != std::string::npos) continue;
    nodes += (nodes.empty() ? "" : " + ") + a.node();
  }
  return nodes.empty() ? "-" : nodes;
}

// Watches the job until it ends, killing the worker that runs it once at `kill_at`.
// Returns the final job record, or an error (interrupted, timed out, coordinator gone).
StatusOr<v1::JobRecord> Watch(RpcClient* client, const std::string& job_id, int64_t steps,
                              int64_t kill_at, int timeout_s, Cluster* cluster) {
  const auto t0 = SteadyClock::now();
  int64_t last_step = -1;
  int64_t last_attempt = -1;
  int64_t furthest_before = 0;  // the furthest step of the attempts before this one
  int last_state = -1;
  bool killed = false;
  int failures = 0;
  while (true) {
    if (g_interrupted) return CancelledError("interrupted");
    if (Since(t0) > timeout_s) {
      return DeadlineExceededError("the job did not finish within " + std::to_string(timeout_s) +
                                   " s (see --timeout)");
    }
    auto info = client->GetJob(job_id);
    if (!info.ok()) {
      if (++failures > 20) return info.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      continue;
    }
    failures = 0;
    const v1::JobRecord& job = info->job();
    if (job.state() != last_state || job.attempt() != last_attempt) {
      std::string line = JobStateName(job.state());
      if (job.attempt() > 0) line += ", attempt " + std::to_string(job.attempt());
      if (job.state() == v1::RUNNING) {
        line += " on " + NodesOf(job) + " (" + std::to_string(job.placement_size()) + " rank" +
                (job.placement_size() == 1 ? "" : "s, data parallel") + ")";
      }
      if (job.attempt() != last_attempt && info->attempts_size() > 0) {
        const v1::AttemptRecord& a = info->attempts(info->attempts_size() - 1);
        if (a.attempt() == job.attempt() && a.resume_step() >= 0) {
          line += ", resuming from the checkpoint of step " + std::to_string(a.resume_step());
        }
      }
      if (!job.reason().empty()) line += " (" + job.reason() + ")";
      std::printf("  [%6.1fs] %s\n", Since(t0), line.c_str());
      if (job.attempt() != last_attempt) furthest_before = job.furthest_step();
      last_state = job.state();
      last_attempt = job.attempt();
    }
    if (IsTerminal(job.state())) return job;
    // Every new step is shown, also one below the last shown: after a recovery the job's
    // step restarts at the checkpoint and the steps up to furthest_step are trained again.
    // The checkpoint's own step is not one: the attempt line above already names it.
    int64_t resume_step = -1;
    if (info->attempts_size() > 0 && info->attempts().rbegin()->attempt() == job.attempt()) {
      resume_step = info->attempts().rbegin()->resume_step();
    }
    // Rank 0's step and loss, from one report: the job's step is the furthest any rank
    // reported, and the other rank's agent may report it before rank 0's loss arrives.
    int64_t step = job.last_step();
    double loss = job.last_loss();
    for (const v1::TrainerStatus& t : info->trainers()) {
      if (t.attempt() == job.attempt() && t.rank() == 0 && t.progress().step() > 0) {
        step = t.progress().step();
        loss = t.progress().loss();
      }
    }
    if (step != last_step && step > 0 && step != resume_step && job.state() == v1::RUNNING) {
      std::printf("  [%6.1fs] step %5lld/%lld%s  loss %.4f  %7.0f tok/s  on %s  checkpoint %s\n",
                  Since(t0), static_cast<long long>(step), static_cast<long long>(steps),
                  RecomputedNote(step, furthest_before).c_str(), loss, job.tokens_per_s(),
                  NodesOf(job).c_str(),
                  job.latest_checkpoint_step() >= 0
                      ? ("step " + std::to_string(job.latest_checkpoint_step())).c_str()
                      : "none yet");
      last_step = step;
    }
    if (!killed && kill_at >= 0 && job.state() == v1::RUNNING && job.last_step() >= kill_at &&
        job.latest_checkpoint_step() > 0) {
      const std::string node = job.placement(0).node();  // rank 0's
      std::printf(
          "\n  >>> kill -9 worker %s (pid %d), which runs rank 0 of the job, at step %lld; the\n"
          "  >>> newest checkpoint is step %lld. Watch the coordinator notice, stop the other\n"
          "  >>> rank and resume the job on the worker that is left.\n\n",
          node.c_str(), static_cast<int>(cluster->pid(node)),
          static_cast<long long>(job.last_step()),
          static_cast<long long>(job.latest_checkpoint_step()));
      cluster->Kill(node);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

Status WaitForWorkers(RpcClient* client, int want) {
  const auto t0 = SteadyClock::now();
  while (Since(t0) < 30) {
    if (g_interrupted) return CancelledError("interrupted");
    auto workers = client->ListWorkers();
    if (workers.ok()) {
      int alive = 0;
      for (const auto& w : workers->workers()) alive += w.node().state() == v1::NODE_ALIVE;
      if (alive >= want) return OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return DeadlineExceededError("the workers did not register within 30 s");
}

// Spec text with the demo's paths filled in.
StatusOr<std::string> DemoSpec(const std::string& spec_path, const fs::path& run,
                               std::vector<std::string> overrides, JobSpec* spec) {
  ASSIGN_OR_RETURN(const std::string text, ReadJobSpecFile(spec_path));
  std::vector<std::string> all = {
      "data.train=" + (run / "data" / "train.bin").string(),
      "data.val=" + (run / "data" / "val.bin").string(),
      "output_dir=" + (run / "job").string(),
      "checkpoint.dir=" + (run / "job" / "ckpt").string(),
  };
  all.insert(all.end(), overrides.begin(), overrides.end());
  ASSIGN_OR_RETURN(std::string yaml, ApplyOverrides(text, all));
  ASSIGN_OR_RETURN(*spec, ParseJobSpec(yaml, {}, spec_path));
  return yaml;
}

void PrintSample(const fs::path& model, const fs::path& run) {
  const std::string cmd = (SelfDir() / "drover").string() + " sample '" + model.string() +
                          "' --prompt 'ROMEO:' --tokens 300 --temperature 0.8 --top-k 40";
  std::printf("\n  A sample from the final model (%s):\n\n", model.c_str());
  std::fflush(stdout);
  const std::string out = (run / "sample.txt").string();
  if (std::system((cmd + " > '" + out + "' 2>&1").c_str()) == 0) {
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) std::printf("    %s\n", line.c_str());
  } else {
    std::printf("    (drover sample failed; see %s)\n", out.c_str());
  }
}

int RunDemo(const DemoFlags& f) {
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const fs::path bin = SelfDir();
  for (const char* exe : {"drover-coordinator", "drover-worker", "drover-trainer"}) {
    if (::access((bin / exe).c_str(), X_OK) != 0) {
      return Fail(std::string(exe) + " is missing next to drover in " + bin.string() +
                  " (build every target: make build)");
    }
  }
  auto text = FindDemoFile(f.text, "deploy/examples/data/shakespeare.txt");
  if (!text.ok()) return Fail("corpus: " + text.status().message(), kExitUsage);
  auto spec_path = FindDemoFile(f.spec, "deploy/examples/demo.yaml");
  if (!spec_path.ok()) return Fail("job spec: " + spec_path.status().message(), kExitUsage);
  const std::string run_str = RunDir(f.dir);
  if (run_str.empty()) return Fail("cannot create a run directory");
  const fs::path run = run_str;
  std::printf("drover demo: run directory %s\n", run.c_str());

  JobSpec spec;
  auto yaml = DemoSpec(*spec_path, run, f.overrides, &spec);
  if (!yaml.ok()) return Fail(yaml.status().message(), kExitUsage);
  Status st = PrepareData(*text, run / "data");
  if (!st.ok()) return Fail(st.ToString());

  auto port = FreeLoopbackPort();
  if (!port.ok()) return Fail(port.status().ToString());
  const std::string address = "127.0.0.1:" + std::to_string(*port);
  Cluster cluster;
  SpawnOptions coord;
  coord.executable = (bin / "drover-coordinator").string();
  coord.args = {"--listen", address, "--state-dir", (run / "state").string()};
  coord.log_path = (run / "logs" / "coordinator.log").string();
  if (!(st = cluster.Start("coordinator", coord)).ok()) return Fail(st.ToString());
  for (const char* name : {"demo-w1", "demo-w2"}) {
    SpawnOptions w;
    w.executable = (bin / "drover-worker").string();
    w.args = {"--coordinator", address,
              "--name",        name,
              "--slots",       "1",
              "--device",      "cpu",
              "--work-dir",    (run / name).string()};
    w.log_path = (run / "logs" / (std::string(name) + ".log")).string();
    if (!(st = cluster.Start(name, w)).ok()) return Fail(st.ToString());
  }
  std::printf("  coordinator on %s, workers demo-w1 and demo-w2 (logs in %s)\n", address.c_str(),
              (run / "logs").c_str());
  RpcClient client(address);
  if (!(st = WaitForWorkers(&client, 2)).ok()) {
    return Fail(st.ToString() + "; see " + (run / "logs").string());
  }
  auto job_id = client.SubmitJob(*yaml, 0);
  if (!job_id.ok()) return Fail(job_id.status().ToString());
  std::printf(
      "  submitted job %s: %s, %d layers x %d channels, %lld steps, checkpoint every "
      "%lld\n\n",
      job_id->c_str(), spec.name.c_str(), spec.model.n_layer, spec.model.n_embd,
      static_cast<long long>(spec.train.steps),
      static_cast<long long>(spec.checkpoint.every_steps));

  const int64_t kill_at = f.no_kill ? -1 : (f.kill_at >= 0 ? f.kill_at : spec.train.steps * 2 / 5);
  auto final_job = Watch(&client, *job_id, spec.train.steps, kill_at, f.timeout_s, &cluster);
  if (!final_job.ok()) {
    std::printf("\n  stopping the cluster\n");
    return Fail(final_job.status().message() + "; logs in " + (run / "logs").string());
  }
  if (final_job->state() != v1::SUCCEEDED) {
    return Fail("job ended " + JobStateName(final_job->state()) + ": " + final_job->reason() +
                "; logs in " + (run / "logs").string());
  }
  std::printf("\n  job %s SUCCEEDED: %lld steps, final loss %.4f, %d restart(s)\n", job_id->c_str(),
              static_cast<long long>(final_job->last_step()), final_job->last_loss(),
              final_job->restarts());
  const fs::path model = run / "job" / "model.bin";
  PrintSample(model, run);
  std::printf(
      "\n  Look further (the cluster is stopped now; the files stay):\n"
      "    metrics, one JSON line per step:  %s\n"
      "    checkpoints:                      %s\n"
      "    coordinator and worker logs:      %s\n"
      "    sample again:  %s/drover sample %s --prompt 'JULIET:' --tokens 500\n"
      "    evaluate:      %s/drover eval %s --data %s --batches 20\n"
      "    train by hand: %s/drover train %s --set data.train=%s --set data.val=%s\n",
      (run / "job" / "metrics.jsonl").c_str(), (run / "job" / "ckpt").c_str(),
      (run / "logs").c_str(), bin.c_str(), model.c_str(), bin.c_str(), model.c_str(),
      (run / "data" / "val.bin").c_str(), bin.c_str(), spec_path->c_str(),
      (run / "data" / "train.bin").c_str(), (run / "data" / "val.bin").c_str());
  return kExitOk;
}

CommandRun SetupDemo(CLI::App* app, GlobalOptions*) {
  auto f = std::make_shared<DemoFlags>();
  app->add_option("--dir", f->dir, "run directory (default: a new one under $TMPDIR)");
  app->add_option("--text", f->text,
                  "training text (default deploy/examples/data/shakespeare.txt)");
  app->add_option("--spec", f->spec, "job spec (default deploy/examples/demo.yaml)");
  app->add_option("--set", f->overrides, "override a spec key: section.key=value");
  app->add_option("--kill-at-step", f->kill_at,
                  "kill the job's worker at this step "
                  "(default 40% of train.steps)");
  app->add_flag("--no-kill", f->no_kill, "do not kill a worker");
  app->add_option("--timeout", f->timeout_s, "give up after this many seconds (default 900)")
      ->check(CLI::PositiveNumber);
  return [f] { return RunDemo(*f); };
}

}  // namespace

DROVER_REGISTER_COMMAND("demo", "Run a local cluster, train, kill a worker, watch it recover",
                        SetupDemo);

}  // namespace drover::cli
