// The NCCL communicator on real GPUs, one rank per device, ranks as threads. Skips itself
// where there is no NCCL build or no GPU; the multi-rank tests need two GPUs.
#include <gtest/gtest.h>

#ifdef DROVER_HAVE_NCCL

#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "worker/engine/parallel/kv_store.h"
#include "worker/engine/parallel/nccl_communicator.h"

namespace drover::engine::parallel {
namespace {

using std::chrono::milliseconds;

int DeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

// One rank: its device, stream and communicator.
struct Rank {
  cudaStream_t stream = nullptr;
  std::unique_ptr<Communicator> comm;
};

void OnEveryRank(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& t : threads) t.join();
}

std::vector<Rank> Connect(InMemoryKvStore* store, int size, milliseconds timeout) {
  std::vector<Rank> ranks(size);
  OnEveryRank(size, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&ranks[rank].stream), cudaSuccess);
    auto comm = ConnectNcclGroup(store, "g", rank, size, rank, ranks[rank].stream,
                                 CommOptions{timeout}, milliseconds(60'000));
    ASSERT_TRUE(comm.ok()) << comm.status();
    ranks[rank].comm = std::move(comm).value();
  });
  return ranks;
}

// Copies host values to a fresh device buffer, runs fn on it, copies the result back.
std::vector<float> OnDevice(const std::vector<float>& host, const std::function<void(float*)>& fn) {
  void* allocated = nullptr;
  EXPECT_EQ(cudaMalloc(&allocated, host.size() * sizeof(float)), cudaSuccess);
  auto* device = static_cast<float*>(allocated);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  fn(device);
  std::vector<float> result(host.size());
  EXPECT_EQ(cudaMemcpy(result.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  return result;
}

TEST(NcclCommunicatorTest, GroupOfOneRunsEveryCollective) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no GPU";
  InMemoryKvStore store;
  std::vector<Rank> ranks = Connect(&store, 1, milliseconds(10'000));
  ASSERT_NE(ranks[0].comm, nullptr);
  Communicator& comm = *ranks[0].comm;
  const std::vector<size_t> counts = {4};
  auto result = OnDevice({1, 2, 3, 4}, [&](float* d) {
    EXPECT_TRUE(comm.AllReduce(d, 4, DataType::kFloat32, ReduceOp::kAverage).ok());
    EXPECT_TRUE(comm.ReduceScatter(d, counts, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_TRUE(comm.AllGather(d, counts, DataType::kFloat32).ok());
    EXPECT_TRUE(comm.Broadcast(d, 4, DataType::kFloat32, 0).ok());
    EXPECT_TRUE(comm.Barrier().ok());
  });
  EXPECT_EQ(result, (std::vector<float>{1, 2, 3, 4}));
}

TEST(NcclCommunicatorTest, TwoRanksReduceAndGatherUnevenChunks) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  InMemoryKvStore store;
  std::vector<Rank> ranks = Connect(&store, 2, milliseconds(10'000));
  const std::vector<size_t> uneven = {3, 1};
  OnEveryRank(2, [&](int rank) {
    ASSERT_EQ(cudaSetDevice(rank), cudaSuccess);
    Communicator& comm = *ranks[rank].comm;
    const float r = static_cast<float>(rank);
    auto summed = OnDevice({1 + r, 2 + r, 3 + r, 4 + r}, [&](float* d) {
      EXPECT_TRUE(comm.AllReduce(d, 4, DataType::kFloat32, ReduceOp::kSum).ok());
    });
    EXPECT_EQ(summed, (std::vector<float>{3, 5, 7, 9}));
    auto scattered = OnDevice({1 + r, 2 + r, 3 + r, 4 + r}, [&](float* d) {
      EXPECT_TRUE(comm.ReduceScatter(d, uneven, DataType::kFloat32, ReduceOp::kAverage).ok());
    });
    if (rank == 0) {
      EXPECT_EQ(std::vector<float>(scattered.begin(), scattered.begin() + 3),
                (std::vector<float>{1.5f, 2.5f, 3.5f}));
    } else {
      EXPECT_EQ(scattered[3], 4.5f);
    }
    auto gathered = OnDevice(
        rank == 0 ? std::vector<float>{7, 8, 9, 0} : std::vector<float>{0, 0, 0, 6},
        [&](float* d) { EXPECT_TRUE(comm.AllGather(d, uneven, DataType::kFloat32).ok()); });
    EXPECT_EQ(gathered, (std::vector<float>{7, 8, 9, 6}));
    auto sent = OnDevice({10 + r, 20 + r}, [&](float* d) {
      if (rank == 0) {
        EXPECT_TRUE(comm.Send(d, 2 * sizeof(float), 1, 0).ok());
      } else {
        EXPECT_TRUE(comm.Recv(d, 2 * sizeof(float), 0, 0).ok());
      }
    });
    EXPECT_EQ(sent, (std::vector<float>{10, 20}));
    EXPECT_TRUE(comm.Barrier().ok());
  });
}

TEST(NcclCommunicatorTest, PeerThatNeverJoinsGivesDeadlineExceededAndAborts) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  InMemoryKvStore store;
  std::vector<Rank> ranks = Connect(&store, 2, milliseconds(1'000));
  std::promise<void> rank0_done;
  OnEveryRank(2, [&](int rank) {
    if (rank == 1) {
      rank0_done.get_future().wait();
      return;
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    Communicator& comm = *ranks[0].comm;
    const auto start = std::chrono::steady_clock::now();
    Status first;
    OnDevice({1},
             [&](float* d) { first = comm.AllReduce(d, 1, DataType::kFloat32, ReduceOp::kSum); });
    rank0_done.set_value();
    EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first;
    EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3'000));
    EXPECT_EQ(comm.Barrier(), first);
  });
}

}  // namespace
}  // namespace drover::engine::parallel

#else  // !DROVER_HAVE_NCCL

TEST(NcclCommunicatorTest, NeedsANcclBuild) { GTEST_SKIP() << "built without NCCL"; }

#endif
