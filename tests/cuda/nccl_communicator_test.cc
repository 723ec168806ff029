// The NCCL communicator through the CUDA plugin (parallel/cuda_groups.h), ranks as processes
// with a GPU each (CUDA_VISIBLE_DEVICES), meeting in a store on the file system. Runs on a
// GPU machine (the multi-rank tests need two GPUs) and, on every commit, on the kernel
// emulator with its NCCL emulator (build/cuda_emu, DROVER_CUDA_EMULATED), where every
// process is a GPU of its own. Skips itself where the plugin has no GPU or no NCCL.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/engine/kernels/cuda_backend.h"
#include "worker/engine/parallel/comm_stream.h"
#include "worker/engine/parallel/cuda_groups.h"
#include "worker/engine/parallel/staged_communicator.h"

namespace drover::engine::parallel {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// GPUs on this machine as the driver lists them; the emulator has as many as wanted.
int GpusHere() {
#ifdef DROVER_CUDA_EMULATED
  return 8;
#else
  std::error_code ec;
  int n = 0;
  for (auto it = fs::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != fs::directory_iterator(); ++it) {
    ++n;
  }
  return n;
#endif
}

// Keys as files of one directory, written whole by rename: the ranks are processes.
class FileKvStore final : public KvStore {
 public:
  explicit FileKvStore(fs::path dir) : dir_(std::move(dir)) {}
  Status Set(const std::string& key, const std::string& value) override {
    const fs::path tmp = dir_ / (Name(key) + ".tmp" + std::to_string(getpid()));
    std::ofstream(tmp, std::ios::binary) << value;
    fs::rename(tmp, dir_ / Name(key));
    return OkStatus();
  }
  StatusOr<std::string> Get(const std::string& key, milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!fs::exists(dir_ / Name(key))) {
      if (std::chrono::steady_clock::now() > deadline) {
        return DeadlineExceededError("no key " + key);
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    std::ifstream in(dir_ / Name(key), std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  static std::string Name(std::string key) {
    for (char& c : key) c = c == '/' ? '_' : c;
    return key;
  }
  fs::path dir_;
};

// Runs `fn(rank)` in one child process per rank, with CUDA_VISIBLE_DEVICES gpus[rank] set
// before the plugin is loaded; a rank fails by returning a message. The parent never touches
// CUDA (a CUDA context does not survive fork).
std::vector<std::string> OnRanks(const std::vector<std::string>& gpus,
                                 const std::function<std::string(int, KvStore*)>& fn) {
  const fs::path dir =
      fs::temp_directory_path() /
      ("drover-nccl-test-" + std::to_string(getpid()) + "-" +
       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < static_cast<int>(gpus.size()); ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("CUDA_VISIBLE_DEVICES", gpus[rank].c_str(), 1);
      FileKvStore store(dir);
      const std::string error = fn(rank, &store);
      std::ofstream(dir / ("result." + std::to_string(rank))) << error;
      std::fflush(nullptr);
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<std::string> results;
  for (int rank = 0; rank < static_cast<int>(pids.size()); ++rank) {
    int status = 0;
    waitpid(pids[rank], &status, 0);
    std::ifstream in(dir / ("result." + std::to_string(rank)));
    std::stringstream s;
    s << in.rdbuf();
    results.push_back(WIFEXITED(status) && WEXITSTATUS(status) == 0
                          ? s.str()
                          : "rank " + std::to_string(rank) + " died (status " +
                                std::to_string(status) + ")");
  }
  fs::remove_all(dir);
  return results;
}

// Skips the test where this machine cannot run NCCL groups (no GPU, a plugin built without
// NCCL) and fails it where a GPU is listed but a rank cannot open it: on a GPU machine a
// broken device must not pass as a skip. Asked in a child, for the parent's sake. (This
// binary is the NCCL tests' own: a process that has used CUDA, as the op tests' does, leaves
// its forked children an unusable runtime, "initialization error".)
#define SKIP_UNLESS_NCCL_GROUPS_RUN()                                                      \
  do {                                                                                     \
    if (GpusHere() == 0) GTEST_SKIP() << "no GPU";                                         \
    const std::string why = NcclGroupsUnusable();                                          \
    if (why.rfind("skip: ", 0) == 0) GTEST_SKIP() << why.substr(6);                        \
    if (!why.empty()) GTEST_FAIL() << "a GPU is listed but a rank cannot use it: " << why; \
  } while (false)

std::string NcclGroupsUnusable() {
  return OnRanks({"0"}, [](int, KvStore*) -> std::string {
    auto ops = CudaOps();
    if (!ops.ok()) return ops.status().ToString();
    auto device = LocalCudaDevice();
    if (!device.ok()) return device.status().ToString();
    return device->nccl ? "" : "skip: the CUDA plugin was built without NCCL";
  })[0];
}

// The rank's vector on the device, `fn` run on it, the result back on the host.
std::vector<float> OnDevice(Ops* ops, const std::vector<float>& host,
                            const std::function<void(float*)>& fn) {
  Buffer device = ops->Allocate(host.size());
  ops->FromHost(device.data(), host.data(), host.size());
  fn(device.data());
  std::vector<float> result(host.size());
  ops->ToHost(result.data(), device.data(), result.size());
  return result;
}

std::string Str(const std::vector<float>& v) {
  std::string s;
  for (float x : v) s += std::to_string(x) + " ";
  return s;
}

#define RANK_EXPECT(cond, what) \
  if (!(cond)) return std::string(what) + " (rank " + std::to_string(rank) + ")"

// Both ways a group completes its calls: at their return, and in stream order (the training
// thread's groups: the compute enqueued after a call sees its result), where Sync returns
// once the transfers have run and the stall they caused is counted. On one GPU this is the
// stream-ordered path's run on a real driver: its events, their timing and the watchdog.
TEST(NcclCommunicatorTest, GroupOfOneRunsEveryCollective) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  for (const bool stream_ordered : {false, true}) {
    auto results = OnRanks({"0"}, [&](int rank, KvStore* store) -> std::string {
      Ops* ops = *CudaOps();
      CommOptions options{milliseconds(10'000)};
      options.stream_ordered = stream_ordered;
      auto comm = ConnectNcclThroughPlugin(ops, store, "g", 0, 1, options, milliseconds(10'000));
      if (!comm.ok()) return comm.status().ToString();
      Communicator& c = **comm;
      const std::vector<size_t> counts = {4};
      Status st;
      auto result = OnDevice(ops, {1, 2, 3, 4}, [&](float* d) {
        st = c.AllReduce(d, 4, DataType::kFloat32, ReduceOp::kAverage);
        if (st.ok()) st = c.ReduceScatter(d, counts, DataType::kFloat32, ReduceOp::kSum);
        if (st.ok()) st = c.AllGather(d, counts, DataType::kFloat32);
        if (st.ok()) st = c.Broadcast(d, 4, DataType::kFloat32, 0);
        if (st.ok()) st = c.Barrier();
        if (st.ok()) ops->Scale(d, 4, 2.0f);
        if (st.ok()) st = c.AllReduce(d, 4, DataType::kFloat32, ReduceOp::kSum);
      });
      if (st.ok()) st = c.Sync();
      RANK_EXPECT(st.ok(), st.ToString());
      RANK_EXPECT(result == (std::vector<float>{2, 4, 6, 8}), "result " + Str(result));
      RANK_EXPECT(c.wait_seconds() >= 0 && c.wait_seconds() < 5,
                  "waited " + std::to_string(c.wait_seconds()) + " s");
      return "";
    });
    EXPECT_EQ(results[0], "") << (stream_ordered ? "stream-ordered" : "complete at return");
  }
}

// Every call on device and host buffers, in both ways a group completes its calls: at
// their return, and in stream order (a send and a receive into one buffer included).
TEST(NcclCommunicatorTest, TwoRanksReduceGatherAndSendOnDeviceAndHostBuffers) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  for (const bool stream_ordered : {false, true}) {
    auto results = OnRanks({"0", "1"}, [&](int rank, KvStore* store) -> std::string {
      Ops* ops = *CudaOps();
      CommOptions options{milliseconds(20'000)};
      options.stream_ordered = stream_ordered;
      auto connected =
          ConnectNcclThroughPlugin(ops, store, "g", rank, 2, options, milliseconds(20'000));
      if (!connected.ok()) return connected.status().ToString();
      // As the trainer uses it: device buffers straight to NCCL, host buffers staged.
      std::unique_ptr<Communicator> comm = StageThroughDevice(std::move(connected).value(), ops);
      const float r = static_cast<float>(rank);
      Status st;
      auto summed = OnDevice(ops, {1 + r, 2 + r, 3 + r, 4 + r}, [&](float* d) {
        st = comm->AllReduce(d, 4, DataType::kFloat32, ReduceOp::kSum);
      });
      RANK_EXPECT(st.ok(), st.ToString());
      RANK_EXPECT(summed == (std::vector<float>{3, 5, 7, 9}), "all-reduce " + Str(summed));
      const std::vector<size_t> uneven = {3, 1};
      auto scattered = OnDevice(ops, {1 + r, 2 + r, 3 + r, 4 + r}, [&](float* d) {
        st = comm->ReduceScatter(d, uneven, DataType::kFloat32, ReduceOp::kAverage);
      });
      RANK_EXPECT(st.ok(), st.ToString());
      if (rank == 0) {
        RANK_EXPECT(std::vector<float>(scattered.begin(), scattered.begin() + 3) ==
                        (std::vector<float>{1.5f, 2.5f, 3.5f}),
                    "reduce-scatter " + Str(scattered));
      } else {
        RANK_EXPECT(scattered[3] == 4.5f, "reduce-scatter " + Str(scattered));
      }
      auto gathered =
          OnDevice(ops, rank == 0 ? std::vector<float>{7, 8, 9, 0} : std::vector<float>{0, 0, 0, 6},
                   [&](float* d) { st = comm->AllGather(d, uneven, DataType::kFloat32); });
      RANK_EXPECT(st.ok(), st.ToString());
      RANK_EXPECT(gathered == (std::vector<float>{7, 8, 9, 6}), "all-gather " + Str(gathered));
      // Two messages each way, matched in order; rank 1 receives first (NCCL has no buffering
      // to let both ranks send first).
      auto exchanged = OnDevice(ops, {10 + r, 20 + r}, [&](float* d) {
        for (int round = 0; round < 2 && st.ok(); ++round) {
          if (rank == 0) {
            st = comm->Send(d, 2 * sizeof(float), 1, 0);
            if (st.ok()) st = comm->Recv(d, 2 * sizeof(float), 1, 0);
          } else {
            st = comm->Recv(d, 2 * sizeof(float), 0, 0);
            if (st.ok()) st = comm->Send(d, 2 * sizeof(float), 0, 0);
          }
        }
      });
      RANK_EXPECT(st.ok(), st.ToString());
      RANK_EXPECT(exchanged == (std::vector<float>{10, 20}), "send/recv " + Str(exchanged));
      // Host buffers (the engine's scalars) go through a device copy.
      double norm = 1.5 + rank;
      st = comm->AllReduce(&norm, 1, DataType::kFloat64, ReduceOp::kSum);
      RANK_EXPECT(st.ok(), st.ToString());
      RANK_EXPECT(norm == 4.0, "host all-reduce " + std::to_string(norm));
      std::vector<float> host_message = {rank == 0 ? 5.f : 0.f, rank == 0 ? 6.f : 0.f};
      st = rank == 0 ? comm->Send(host_message.data(), 8, 1, 0)
                     : comm->Recv(host_message.data(), 8, 0, 0);
      RANK_EXPECT(st.ok(), st.ToString());
      RANK_EXPECT(host_message == (std::vector<float>{5, 6}), "host send " + Str(host_message));
      st = comm->Barrier();
      if (st.ok()) st = comm->Sync();
      RANK_EXPECT(st.ok(), st.ToString());
      return "";
    });
    const char* mode = stream_ordered ? "stream-ordered" : "complete at return";
    EXPECT_EQ(results[0], "") << mode;
    EXPECT_EQ(results[1], "") << mode;
  }
}

// NCCL connects to a peer at the first transfer, so a group's first call waits for a late
// peer up to the connect timeout; a later call only up to the call timeout, and then the
// communicator is aborted.
TEST(NcclCommunicatorTest, OnlyTheFirstCallWaitsForALatePeerUpToTheConnectTimeout) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  auto results = OnRanks({"0", "1"}, [](int rank, KvStore* store) -> std::string {
    Ops* ops = *CudaOps();
    auto comm = ConnectNcclThroughPlugin(ops, store, "g", rank, 2, CommOptions{milliseconds(300)},
                                         milliseconds(20'000));
    if (!comm.ok()) return comm.status().ToString();
    Status st;
    if (rank == 1) std::this_thread::sleep_for(milliseconds(1'500));
    OnDevice(ops, {1},
             [&](float* d) { st = (*comm)->AllReduce(d, 1, DataType::kFloat32, ReduceOp::kSum); });
    RANK_EXPECT(st.ok(), "first all-reduce, the peer 1.5 s late: " + st.ToString());
    if (rank == 1) std::this_thread::sleep_for(milliseconds(1'500));
    const auto start = std::chrono::steady_clock::now();
    OnDevice(ops, {1},
             [&](float* d) { st = (*comm)->AllReduce(d, 1, DataType::kFloat32, ReduceOp::kSum); });
    if (rank == 0) {
      RANK_EXPECT(st.code() == StatusCode::kDeadlineExceeded,
                  "second all-reduce, the peer 1.5 s late: " + st.ToString());
      RANK_EXPECT(std::chrono::steady_clock::now() - start < milliseconds(1'400),
                  "the second all-reduce outlived its 300 ms timeout");
      RANK_EXPECT(st.message().find("within 300 ms") != std::string::npos, st.message());
    }
    return "";  // rank 1 finds its peer aborted: any error will do
  });
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
}

// A rank's wait counts from the compute before the call having finished to the transfer's
// end: the rank that comes late waits little, the one kept waiting about as long as it was.
TEST(NcclCommunicatorTest, WaitSecondsIsTheTimeEachRankSpentWaitingForTheLateOne) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  auto results = OnRanks({"0", "1"}, [](int rank, KvStore* store) -> std::string {
    Ops* ops = *CudaOps();
    auto comm = ConnectNcclThroughPlugin(ops, store, "g", rank, 2,
                                         CommOptions{milliseconds(10'000)}, milliseconds(20'000));
    if (!comm.ok()) return comm.status().ToString();
    Status st;
    // The first call also connects: it is left out.
    OnDevice(ops, {1},
             [&](float* d) { st = (*comm)->AllReduce(d, 1, DataType::kFloat32, ReduceOp::kSum); });
    RANK_EXPECT(st.ok(), "first all-reduce: " + st.ToString());
    const double before = (*comm)->wait_seconds();
    if (rank == 1) std::this_thread::sleep_for(milliseconds(500));
    OnDevice(ops, {1},
             [&](float* d) { st = (*comm)->AllReduce(d, 1, DataType::kFloat32, ReduceOp::kSum); });
    RANK_EXPECT(st.ok(), "second all-reduce: " + st.ToString());
    const double waited = (*comm)->wait_seconds() - before;
    if (rank == 0) RANK_EXPECT(waited >= 0.4, "waited " + std::to_string(waited) + " s");
    if (rank == 1)
      RANK_EXPECT(waited < 0.2, "the late rank waited " + std::to_string(waited) + " s");
    return "";
  });
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
}

// Device work of at least about 200 ms: `repeats` scalings of `x` (n floats), `repeats`
// doubled until one run, synchronised, takes that long (an emulated GPU is slow, a real one
// fast).
int CalibrateRepeats(Ops* ops, float* x, size_t n) {
  for (int repeats = 1;; repeats *= 2) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) ops->Scale(x, n, 1.0f);
    ops->Synchronize();
    if (std::chrono::steady_clock::now() - t0 >= milliseconds(200) || repeats >= (1 << 20)) {
      return repeats;
    }
  }
}

// As a gradient bucket's reduction beside backward: rank 0 hands an all-reduce to a CommStream
// and enqueues about 200 ms of device work; rank 1 comes 600 ms late. The group counts none
// of the call (it was beside the compute), and the stream counts what rank 0 stalled: from
// its device work having finished to the transfer's end, about 600 - 200 ms, not the 600 ms
// of the call nor (before) the whole call from the GPU reaching it. The late rank stalls
// only for the transfer.
TEST(NcclCommunicatorTest, CallsBesideComputeCountOnlyWhatTheRankStalledForThem) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  auto results = OnRanks({"0", "1"}, [](int rank, KvStore* store) -> std::string {
    constexpr auto kLate = milliseconds(600);
    Ops* ops = *CudaOps();
    auto comm = ConnectNcclThroughPlugin(ops, store, "g", rank, 2,
                                         CommOptions{milliseconds(10'000)}, milliseconds(20'000));
    if (!comm.ok()) return comm.status().ToString();
    constexpr size_t kN = 1 << 20;
    Buffer work = ops->Allocate(kN);
    ops->Fill(work.data(), 1.0f, kN);
    Buffer data = ops->Allocate(4);
    ops->Fill(data.data(), 1.0f, 4);
    // The first call also connects: it is left out.
    Status st = (*comm)->AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    RANK_EXPECT(st.ok(), "first all-reduce: " + st.ToString());
    const int repeats = rank == 0 ? CalibrateRepeats(ops, work.data(), kN) : 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) ops->Scale(work.data(), kN, 1.0f);
    ops->Synchronize();
    const double compute =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Both ranks meet here, so that the lateness is rank 1's alone.
    st = (*comm)->Barrier();
    RANK_EXPECT(st.ok(), "barrier: " + st.ToString());
    const double group_before = (*comm)->wait_seconds();
    CommStream stream("dp reduction", ops);
    if (rank == 1) std::this_thread::sleep_for(kLate);
    const CommStream::Ticket t = stream.Submit(
        [&] { return (*comm)->AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum); });
    for (int i = 0; i < repeats; ++i) ops->Scale(work.data(), kN, 1.0f);
    st = stream.Wait(t);
    RANK_EXPECT(st.ok(), "all-reduce beside compute: " + st.ToString());
    const double stalled = stream.overlapped_waits_seconds();
    const double group = (*comm)->wait_seconds() - group_before;
    RANK_EXPECT(group < 1e-6, "the group counted " + std::to_string(group) + " s of the call");
    const std::string seen = "stalled " + std::to_string(stalled) + " s beside " +
                             std::to_string(compute) + " s of device work";
    if (rank == 0) {
      const double late = std::chrono::duration<double>(kLate).count();
      RANK_EXPECT(stalled >= 0.05, seen);
      RANK_EXPECT(stalled <= late - compute / 2, seen + ": its compute counted as stalling");
    } else {
      RANK_EXPECT(stalled < 0.1, "the late rank " + seen);
    }
    return "";
  });
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
}

// As a gradient bucket handed to the dp CommStream while its thread is still busy with the
// bucket before (100 ms here) and the training thread enqueues the rest of backward (2 C of
// device work, C >= 200 ms): the reduction follows the compute marked when it was handed over
// (MarkCompute after the bucket's kernels, FollowMark on the stream's thread), so it is done
// about when the stream's thread is free, while that backward still runs. Before, it followed
// everything enqueued when the thread made the call, the whole 2 C, and so did every bucket
// after it. Its result is the sum. The group is wrapped as the trainer wraps its NCCL groups
// (StageThroughDevice), which must pass the mark on.
TEST(NcclCommunicatorTest, AReductionHandedToAStreamFollowsOnlyTheComputeMarkedForIt) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  auto results = OnRanks({"0", "1"}, [](int rank, KvStore* store) -> std::string {
    constexpr auto kBusy = milliseconds(100);
    Ops* ops = *CudaOps();
    auto nccl = ConnectNcclThroughPlugin(ops, store, "dp", rank, 2,
                                         CommOptions{milliseconds(10'000)}, milliseconds(20'000));
    if (!nccl.ok()) return nccl.status().ToString();
    std::unique_ptr<Communicator> comm = StageThroughDevice(std::move(*nccl), ops);
    constexpr size_t kN = 1 << 20;
    Buffer work = ops->Allocate(kN);
    ops->Fill(work.data(), 1.0f, kN);
    Buffer data = ops->Allocate(4);
    ops->Fill(data.data(), 1.0f, 4);
    // The first call also connects.
    Status st = comm->AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    RANK_EXPECT(st.ok(), "first all-reduce: " + st.ToString());
    const int repeats = CalibrateRepeats(ops, work.data(), kN);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) ops->Scale(work.data(), kN, 1.0f);
    ops->Synchronize();
    const double compute =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st = comm->Barrier();
    RANK_EXPECT(st.ok(), "barrier: " + st.ToString());

    CommStream stream("dp reduction", ops);
    stream.Submit([&] {  // the bucket before, still being reduced
      std::this_thread::sleep_for(kBusy);
      return OkStatus();
    });
    t0 = std::chrono::steady_clock::now();
    ops->Fill(data.data(), static_cast<float>(rank + 1), 4);  // this bucket's gradient
    std::shared_ptr<const ComputeMark> mark = comm->MarkCompute();
    RANK_EXPECT(mark != nullptr, "an NCCL group made no mark");
    const CommStream::Ticket t = stream.Submit([&, mark] {
      comm->FollowMark(mark);
      return comm->AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    });
    for (int i = 0; i < 2 * repeats; ++i) ops->Scale(work.data(), kN, 1.0f);  // more backward
    st = stream.Wait(t);
    const double reduced =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RANK_EXPECT(st.ok(), "all-reduce: " + st.ToString());
    const double busy = std::chrono::duration<double>(kBusy).count();
    RANK_EXPECT(reduced < busy + compute,
                "the reduction was done " + std::to_string(reduced) + " s after it was handed " +
                    "over, beside " + std::to_string(2 * compute) +
                    " s of compute enqueued after it: it waited for that compute");
    std::vector<float> got(4);
    ops->ToHost(got.data(), data.data(), 4);
    RANK_EXPECT(got == (std::vector<float>(4, 3.0f)), "reduced to " + Str(got));
    return "";
  });
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
}

// As a pipeline stage's receive: rank 0 enqueues about C >= 200 ms of device work and then
// receives from rank 1, which sends C / 4 after they meet. The receive's wait counts from
// that work having finished, so rank 0 waits for its peer only the transfer, not the C of
// its own backlog (pp_wait_ms); and the receive's deadline starts there too, so a timeout
// of C / 2 is no reason to fail it (before, both started at the post). A second receive,
// from a peer C + 400 ms late, still counts about 400 ms.
TEST(NcclCommunicatorTest, AReceiveBehindComputeCountsAndTimesOnlyTheWaitForThePeer) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  auto results = OnRanks({"0", "1"}, [](int rank, KvStore* store) -> std::string {
    Ops* ops = *CudaOps();
    constexpr size_t kN = 1 << 20;
    Buffer work = ops->Allocate(kN);
    ops->Fill(work.data(), 1.0f, kN);
    Buffer data = ops->Allocate(4);
    ops->Fill(data.data(), static_cast<float>(rank + 1), 4);
    // Rank 0's device work, timed before the groups exist so that its timeout can depend on it.
    int repeats = 0;
    double compute = 0;
    if (rank == 0) {
      repeats = CalibrateRepeats(ops, work.data(), kN);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < repeats; ++i) ops->Scale(work.data(), kN, 1.0f);
      ops->Synchronize();
      compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      RANK_EXPECT(store->Set("compute", std::to_string(compute)).ok(), "store");
    } else {
      auto got = store->Get("compute", milliseconds(60'000));
      RANK_EXPECT(got.ok(), got.status().ToString());
      compute = std::stod(*got);
    }
    const auto c = std::chrono::duration<double>(compute);
    auto sync = ConnectNcclThroughPlugin(ops, store, "sync", rank, 2,
                                         CommOptions{milliseconds(10'000)}, milliseconds(20'000));
    if (!sync.ok()) return sync.status().ToString();
    // Rank 0 gives a transfer on "p2p" C / 2 after its compute; rank 1, sending, 10 s.
    const auto timeout =
        rank == 0 ? std::chrono::duration_cast<milliseconds>(c / 2) : milliseconds(10'000);
    auto p2p = ConnectNcclThroughPlugin(ops, store, "p2p", rank, 2, CommOptions{timeout},
                                        milliseconds(20'000));
    if (!p2p.ok()) return p2p.status().ToString();
    // The first transfer of each group also connects: left out.
    Status st = (*sync)->Barrier();
    if (st.ok()) {
      st = rank == 0 ? (*p2p)->Recv(data.data(), 4, 1, 0) : (*p2p)->Send(data.data(), 4, 0, 0);
    }
    if (st.ok()) st = (*sync)->Barrier();
    RANK_EXPECT(st.ok(), "warm-up: " + st.ToString());
    // A receive behind the compute, from a peer that is on time.
    const auto exchange = [&](Communicator* comm, std::chrono::duration<double> late,
                              double* waited) {
      const double before = comm->wait_seconds();
      if (rank == 0) {
        for (int i = 0; i < repeats; ++i) ops->Scale(work.data(), kN, 1.0f);
        st = comm->Recv(data.data(), 4 * sizeof(float), 1, 0);
      } else {
        std::this_thread::sleep_for(late);
        st = comm->Send(data.data(), 4 * sizeof(float), 0, 0);
      }
      *waited = comm->wait_seconds() - before;
    };
    double waited = 0;
    exchange(p2p->get(), c / 4, &waited);
    const std::string seen = "waited " + std::to_string(waited) + " s beside " +
                             std::to_string(compute) + " s of device work";
    RANK_EXPECT(st.ok(), "receive behind compute (" + seen + "): " + st.ToString());
    if (rank == 0) {
      RANK_EXPECT(waited < compute / 4, seen + ": its compute counted as waiting");
      std::vector<float> got(4);
      ops->ToHost(got.data(), data.data(), 4);
      RANK_EXPECT(got == (std::vector<float>(4, 2.0f)), "received " + Str(got));
    }
    st = (*sync)->Barrier();
    RANK_EXPECT(st.ok(), "barrier: " + st.ToString());
    // The same from a peer 400 ms later than the compute, on a group that allows it.
    exchange(sync->get(), c + milliseconds(400), &waited);
    RANK_EXPECT(st.ok(), "receive from a late peer: " + st.ToString());
    if (rank == 0) {
      RANK_EXPECT(waited >= 0.2, "waited " + std::to_string(waited) + " s for a peer 0.4 s late");
    }
    return "";
  });
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
}

// A group as the trainer connects those of its training thread (tp, pp, world):
// stream-ordered.
StatusOr<std::unique_ptr<Communicator>> ConnectStreamOrdered(Ops* ops, KvStore* store, int rank,
                                                             milliseconds timeout) {
  CommOptions options{timeout};
  options.stream_ordered = true;
  return ConnectNcclThroughPlugin(ops, store, "g", rank, 2, options, milliseconds(20'000));
}

// Stream order (CommOptions::stream_ordered): an all-reduce and a receive whose peer comes
// 600 ms late each return at once, the host going on; the kernels enqueued after them see
// their results; and the rank's wait is what its compute stalled for them, counted by Sync.
TEST(NcclCommunicatorTest, StreamOrderedCallsReturnBeforeTheirTransfersAndTheComputeAfterSeesThem) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  auto results = OnRanks({"0", "1"}, [](int rank, KvStore* store) -> std::string {
    Ops* ops = *CudaOps();
    auto comm = ConnectStreamOrdered(ops, store, rank, milliseconds(10'000));
    if (!comm.ok()) return comm.status().ToString();
    Communicator& c = **comm;
    Buffer data = ops->Allocate(4);
    Buffer received = ops->Allocate(4);
    ops->Fill(data.data(), static_cast<float>(rank + 1), 4);
    // The first transfer also connects: left out.
    Status st = c.AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);  // 3
    if (st.ok()) st = c.Sync();
    RANK_EXPECT(st.ok(), "warm-up: " + st.ToString());
    const double before = c.wait_seconds();
    constexpr milliseconds kLate(600);
    std::chrono::steady_clock::duration returned[2];
    for (int call = 0; call < 2 && st.ok(); ++call) {
      if (rank == 1) std::this_thread::sleep_for(kLate);
      const auto t0 = std::chrono::steady_clock::now();
      if (call == 0) {
        st = c.AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);  // 6
        ops->Scale(data.data(), 4, 10.0f);                                     // after it: 60
      } else if (rank == 0) {
        st = c.Recv(received.data(), 4 * sizeof(float), 1, 0);
        ops->Scale(received.data(), 4, 2.0f);  // rank 1's 60, doubled
      } else {
        st = c.Send(data.data(), 4 * sizeof(float), 0, 0);
      }
      returned[call] = std::chrono::steady_clock::now() - t0;
    }
    RANK_EXPECT(st.ok(), st.ToString());
    std::vector<float> got(4), got_received(4);
    ops->ToHost(got.data(), data.data(), 4);
    RANK_EXPECT(got == std::vector<float>(4, 60.0f), "all-reduced, then scaled: " + Str(got));
    st = c.Sync();
    RANK_EXPECT(st.ok(), "sync: " + st.ToString());
    const double waited = c.wait_seconds() - before;
    if (rank == 0) {
      for (int call = 0; call < 2; ++call) {
        RANK_EXPECT(returned[call] < kLate / 2,
                    "call " + std::to_string(call) + " returned after " +
                        std::to_string(std::chrono::duration<double>(returned[call]).count()) +
                        " s, its peer 0.6 s late");
      }
      ops->ToHost(got_received.data(), received.data(), 4);
      RANK_EXPECT(got_received == std::vector<float>(4, 120.0f),
                  "received, then doubled: " + Str(got_received));
      RANK_EXPECT(waited >= 0.9, "stalled " + std::to_string(waited) + " s for two 0.6 s waits");
    } else {
      RANK_EXPECT(waited < 0.3, "the late rank stalled " + std::to_string(waited) + " s");
    }
    return "";
  });
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
}

// Stream order keeps the deadline with no call to keep it: rank 0's all-reduce, whose peer
// never comes, returns, and its compute waits for the transfer; the group's watchdog aborts
// it at the 300 ms timeout, which releases the compute (a ToHost returns), and Sync and the
// next call report the deadline. A hang would leave the ToHost waiting for good.
TEST(NcclCommunicatorTest, AStreamOrderedTransferThatHangsIsAbortedAtItsDeadlineWithNoCaller) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  if (GpusHere() < 2) GTEST_SKIP() << "needs two GPUs";
  auto results = OnRanks({"0", "1"}, [](int rank, KvStore* store) -> std::string {
    Ops* ops = *CudaOps();
    auto comm = ConnectStreamOrdered(ops, store, rank, milliseconds(300));
    if (!comm.ok()) return comm.status().ToString();
    Communicator& c = **comm;
    Buffer data = ops->Allocate(4);
    ops->Fill(data.data(), 1.0f, 4);
    Status st = c.AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    if (st.ok()) st = c.Sync();
    RANK_EXPECT(st.ok(), "warm-up: " + st.ToString());
    if (rank == 1) {
      std::this_thread::sleep_for(milliseconds(3'000));
      return "";  // never takes part; its group finds the peer's abort
    }
    const auto t0 = std::chrono::steady_clock::now();
    st = c.AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    RANK_EXPECT(st.ok(), "the call returns before its transfer: " + st.ToString());
    std::vector<float> got(4);
    ops->ToHost(got.data(), data.data(), 4);  // waits for the transfer, until the abort
    const double released =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    RANK_EXPECT(released >= 0.25 && released < 2.0,
                "the compute was released " + std::to_string(released) + " s after the call");
    st = c.Sync();
    RANK_EXPECT(st.code() == StatusCode::kDeadlineExceeded, "sync: " + st.ToString());
    RANK_EXPECT(st.message().find("AllReduce") != std::string::npos &&
                    st.message().find("within 300 ms") != std::string::npos,
                st.message());
    st = c.AllReduce(data.data(), 4, DataType::kFloat32, ReduceOp::kSum);
    RANK_EXPECT(st.code() == StatusCode::kDeadlineExceeded, "the next call: " + st.ToString());
    return "";
  });
  EXPECT_EQ(results[0], "");
  EXPECT_EQ(results[1], "");
}

TEST(NcclCommunicatorTest, TwoRanksOnOneGpuAreRefused) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  auto results = OnRanks({"0", "0"}, [](int rank, KvStore* store) -> std::string {
    auto comm = ConnectNcclThroughPlugin(*CudaOps(), store, "g", rank, 2,
                                         CommOptions{milliseconds(20'000)}, milliseconds(20'000));
    return comm.ok() ? "connected" : comm.status().ToString();
  });
  for (const std::string& r : results) EXPECT_NE(r, "connected");
  for (const std::string& r : results)
    EXPECT_NE(r.find("nccl group \"g\""), std::string::npos) << r;
}

TEST(NcclCommunicatorTest, PeerThatNeverJoinsGivesDeadlineExceeded) {
  SKIP_UNLESS_NCCL_GROUPS_RUN();
  auto results = OnRanks({"0"}, [](int, KvStore* store) -> std::string {
    const auto start = std::chrono::steady_clock::now();
    auto comm = ConnectNcclThroughPlugin(*CudaOps(), store, "g", 0, 2,
                                         CommOptions{milliseconds(10'000)}, milliseconds(1'000));
    const auto took = std::chrono::steady_clock::now() - start;
    if (comm.ok()) return std::string("connected without its peer");
    if (comm.status().code() != StatusCode::kDeadlineExceeded) return comm.status().ToString();
    if (took > milliseconds(5'000)) return std::string("took too long");
    return std::string();
  });
  EXPECT_EQ(results[0], "");
}

}  // namespace
}  // namespace drover::engine::parallel
