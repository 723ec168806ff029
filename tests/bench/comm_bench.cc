// Collective bandwidth of the Gloo communicator on loopback: N ranks as processes (fork,
// so each has its own Gloo event loop and allocator, as real trainers do), each collective
// at a few sizes, next to a plain memcpy of the same size timed in the same run.
//
// Bandwidths follow nccl-tests (doc/PERFORMANCE.md there): algbw = bytes / time, and the
// bus bandwidth, which is comparable across rank counts and with the link speed, is
//   all-reduce                      2 (n - 1) / n * algbw
//   reduce-scatter, all-gather          (n - 1) / n * algbw   (bytes = the whole buffer)
//   broadcast, send/recv                              algbw
// "send_recv" is a ring exchange: every rank sends `bytes` right and receives from the left
// at once. "rs+ag" is an all-reduce composed of the two rings, for comparison with Gloo's.
//
// The ranks rendezvous through a directory of files (a KvStore local to this program).
// Rank 0 prints; the last line is one JSON object.
//
//   bench_comm_bench [--ranks 2] [--sizes-mib 1,16,64] [--iters 5] [--warmup 1]
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/engine/parallel/gloo_communicator.h"
#include "worker/engine/parallel/kv_store.h"

namespace {

namespace fs = std::filesystem;
namespace parallel = drover::engine::parallel;
using Clock = std::chrono::steady_clock;
using drover::Status;
using drover::StatusOr;

struct Options {
  int ranks = 2;
  std::vector<int> sizes_mib = {1, 16, 64};
  int iters = 5;
  int warmup = 1;
};

// A KvStore shared by processes through files in one directory: Set writes a temporary
// file and renames it (readers never see half a value); Get polls for the file.
class FileKvStore final : public parallel::KvStore {
 public:
  explicit FileKvStore(fs::path dir) : dir_(std::move(dir)) {}

  Status Set(const std::string& key, const std::string& value) override {
    const fs::path final_path = Path(key);
    const fs::path tmp = final_path.string() + ".tmp" + std::to_string(::getpid());
    std::ofstream(tmp, std::ios::binary) << value;
    std::error_code ec;
    fs::rename(tmp, final_path, ec);
    return ec ? drover::InternalError("rename " + tmp.string() + ": " + ec.message())
              : drover::OkStatus();
  }

  StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    while (!fs::exists(Path(key))) {
      if (Clock::now() >= deadline) return drover::DeadlineExceededError("key " + key);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream in(Path(key), std::ios::binary);
    std::stringstream value;
    value << in.rdbuf();
    return value.str();
  }

 private:
  fs::path Path(std::string key) const {
    for (char& c : key) c = (c == '/') ? '|' : c;
    return dir_ / key;
  }
  const fs::path dir_;
};

struct Result {
  std::string op, algorithm;
  size_t bytes;
  double ms, algbw, busbw, memcpy_gbs;
};

double GBps(size_t bytes, double seconds) { return bytes / seconds / 1e9; }

// Seconds per call of fn, averaged over `iters` after `warmup` untimed calls.
double TimePerCall(int warmup, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double>(Clock::now() - start).count() / iters;
}

void Check(const Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
    std::fflush(stderr);
    _exit(1);
  }
}

// One rank's whole run; rank 0 prints.
void RunRank(const Options& o, int rank, FileKvStore* store, std::vector<Result>* results) {
  auto transport = parallel::GlooTransport::Create("127.0.0.1");
  Check(transport.status(), "transport");
  const std::chrono::milliseconds timeout(120'000);
  auto connected = parallel::ConnectGlooGroup(*transport, store, "bench", rank, o.ranks,
                                              parallel::CommOptions{timeout}, timeout);
  Check(connected.status(), "connect");
  parallel::Communicator& comm = **connected;
  const int n = o.ranks;
  const double ring = double(n - 1) / n;

  for (int mib : o.sizes_mib) {
    const size_t bytes = size_t(mib) << 20;
    const size_t count = bytes / sizeof(float);
    std::vector<float> data(count, 1.f), copy(count, 0.f);
    std::vector<size_t> counts(n, count / n);
    counts.back() += count % n;
    std::vector<float> received(count);

    // The baseline: while rank 0 copies, the others wait in the barrier (asleep); the first
    // barrier keeps their page faults of the allocations above out of the measurement.
    Check(comm.Barrier(), "barrier");
    double memcpy_s = 0;
    if (rank == 0) {
      memcpy_s =
          TimePerCall(o.warmup, o.iters, [&] { std::memcpy(copy.data(), data.data(), bytes); });
    }
    Check(comm.Barrier(), "barrier");

    auto measure = [&](const char* op, const char* algorithm, double bus_factor,
                       const std::function<Status()>& call) {
      Check(comm.Barrier(), "barrier");
      const double s = TimePerCall(o.warmup, o.iters, [&] { Check(call(), op); });
      Check(comm.Barrier(), "barrier");
      if (rank != 0) return;
      const double algbw = GBps(bytes, s);
      results->push_back(
          {op, algorithm, bytes, s * 1e3, algbw, algbw * bus_factor, GBps(bytes, memcpy_s)});
      const Result& r = results->back();
      std::printf("%6d MiB  %-14s %-34s %9.2f %10.2f %10.2f %11.2f %10.2f\n", mib, op, algorithm,
                  r.ms, r.algbw, r.busbw, r.memcpy_gbs, r.busbw / r.memcpy_gbs);
      std::fflush(stdout);
    };

    measure("all_reduce", "gloo ring", 2 * ring, [&] {
      return comm.AllReduce(data.data(), count, parallel::DataType::kFloat32,
                            parallel::ReduceOp::kSum);
    });
    measure("reduce_scatter", "drover ring, 1 MiB segments", ring, [&] {
      return comm.ReduceScatter(data.data(), counts, parallel::DataType::kFloat32,
                                parallel::ReduceOp::kSum);
    });
    measure("all_gather", "drover ring, 1 MiB segments", ring,
            [&] { return comm.AllGather(data.data(), counts, parallel::DataType::kFloat32); });
    measure("rs+ag", "drover rings (an all-reduce)", 2 * ring, [&] {
      Status s = comm.ReduceScatter(data.data(), counts, parallel::DataType::kFloat32,
                                    parallel::ReduceOp::kSum);
      return s.ok() ? comm.AllGather(data.data(), counts, parallel::DataType::kFloat32) : s;
    });
    measure("broadcast", "gloo (root 0)", 1.0,
            [&] { return comm.Broadcast(data.data(), count, parallel::DataType::kFloat32, 0); });
    measure("send_recv", "unbound buffers, ring exchange", 1.0, [&]() -> Status {
      auto recv = comm.Irecv(received.data(), bytes, (rank + n - 1) % n, 1);
      if (!recv.ok()) return recv.status();
      Status sent = comm.Send(data.data(), bytes, (rank + 1) % n, 1);
      Status got = (*recv)->Wait();
      return sent.ok() ? got : sent;
    });
  }
}

std::string Json(const Options& o, const std::vector<Result>& results) {
  std::ostringstream j;
  j << "{\"bench\":\"comm\",\"backend\":\"gloo\",\"ranks\":" << o.ranks
    << ",\"ranks_are\":\"processes\",\"iters\":" << o.iters << ",\"results\":[";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    j << (i ? "," : "") << "{\"op\":\"" << r.op << "\",\"algorithm\":\"" << r.algorithm
      << "\",\"bytes\":" << r.bytes << ",\"ms\":" << r.ms << ",\"algbw_gbs\":" << r.algbw
      << ",\"busbw_gbs\":" << r.busbw << ",\"memcpy_gbs\":" << r.memcpy_gbs
      << ",\"busbw_over_memcpy\":" << r.busbw / r.memcpy_gbs << "}";
  }
  j << "]}";
  return j.str();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"drover Gloo collective bandwidth on loopback"};
  app.add_option("--ranks", o.ranks, "ranks (processes)")->check(CLI::Range(2, 64));
  app.add_option("--sizes-mib", o.sizes_mib, "buffer sizes in MiB")->delimiter(',');
  app.add_option("--iters", o.iters, "timed calls per measurement")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed calls first")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  char tmpl[] = "/tmp/drover_comm_bench_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path dir = tmpl;
  std::printf(
      "comm_bench: gloo, %d ranks as processes (fork), loopback 127.0.0.1, %d calls after %d "
      "warm-up; %u CPUs\n",
      o.ranks, o.iters, o.warmup, std::thread::hardware_concurrency());
  std::printf("%10s  %-14s %-34s %9s %10s %10s %11s %10s\n", "size", "op", "algorithm", "ms",
              "algbw GB/s", "busbw GB/s", "memcpy GB/s", "bus/memcpy");
  std::fflush(stdout);

  // Fork before any thread exists in this process (Gloo starts threads); the parent only
  // waits.
  std::vector<pid_t> children;
  for (int rank = 0; rank < o.ranks; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      FileKvStore store(dir);
      std::vector<Result> results;
      RunRank(o, rank, &store, &results);
      if (rank == 0) std::printf("%s\n", Json(o, results).c_str());
      std::fflush(stdout);
      _exit(0);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  fs::remove_all(dir);
  if (failed > 0) std::fprintf(stderr, "comm_bench: %d rank(s) failed\n", failed);
  return failed > 0 ? 1 : 0;
}
