// The Gloo communicator against serial references, with ranks run as threads of this
// process (one GlooTransport each, as if each were its own process) on loopback.
//
// Inputs are small integers, so every sum is exact in float32 and float64 whatever the
// order of the additions, and results are compared with ==. Failure tests use short
// timeouts and bound the time every rank took.
#include "worker/engine/parallel/gloo_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "worker/engine/parallel/comm_stream.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::parallel {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kConnectTimeout{5'000};

// Runs fn(rank) on one thread per rank and joins them all.
void OnEveryRank(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& t : threads) t.join();
}

// `size` ranks of one group, connected.
struct Group {
  InMemoryKvStore store;
  std::vector<std::shared_ptr<GlooTransport>> transports;
  std::vector<std::unique_ptr<Communicator>> comms;
};

std::unique_ptr<Group> ConnectGroup(int size, milliseconds timeout = milliseconds(10'000)) {
  auto group = std::make_unique<Group>();
  for (int rank = 0; rank < size; ++rank) {
    auto transport = GlooTransport::Create("127.0.0.1");
    EXPECT_TRUE(transport.ok()) << transport.status();
    group->transports.push_back(*transport);
  }
  group->comms.resize(size);
  OnEveryRank(size, [&](int rank) {
    auto comm = ConnectGlooGroup(group->transports[rank], &group->store, "g", rank, size,
                                 CommOptions{timeout}, kConnectTimeout);
    ASSERT_TRUE(comm.ok()) << comm.status();
    group->comms[rank] = std::move(comm).value();
  });
  for (const auto& comm : group->comms) EXPECT_NE(comm, nullptr);
  return group;
}

template <typename T>
constexpr DataType TypeOf() {
  return std::is_same_v<T, float> ? DataType::kFloat32 : DataType::kFloat64;
}

// Rank `rank`'s input: small integers, different on every rank and element.
template <typename T>
std::vector<T> Input(size_t count, int rank) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i)
    v[i] = static_cast<T>(static_cast<int>((i * 7 + rank * 13) % 23) - 11);
  return v;
}

// The element-wise reduction of every rank's Input, computed serially.
template <typename T>
std::vector<T> Reference(size_t count, int size, ReduceOp op) {
  std::vector<T> sum(count, T(0));
  for (int r = 0; r < size; ++r) {
    std::vector<T> in = Input<T>(count, r);
    for (size_t i = 0; i < count; ++i) sum[i] += in[i];
  }
  if (op == ReduceOp::kAverage) {
    for (T& x : sum) x /= static_cast<T>(size);
  }
  return sum;
}

std::vector<size_t> Offsets(const std::vector<size_t>& counts) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  return offsets;
}

class GlooCommunicatorTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { group_ = ConnectGroup(GetParam()); }
  int size() const { return GetParam(); }
  Communicator& comm(int rank) { return *group_->comms[rank]; }

  template <typename T>
  void CheckAllReduce(size_t count, ReduceOp op) {
    const std::vector<T> expected = Reference<T>(count, size(), op);
    OnEveryRank(size(), [&](int rank) {
      std::vector<T> data = Input<T>(count, rank);
      ASSERT_TRUE(comm(rank).AllReduce(data.data(), count, TypeOf<T>(), op).ok());
      EXPECT_EQ(data, expected) << "rank " << rank;
    });
  }

  template <typename T>
  void CheckReduceScatter(const std::vector<size_t>& counts, ReduceOp op) {
    const std::vector<size_t> offsets = Offsets(counts);
    const std::vector<T> expected = Reference<T>(offsets.back(), size(), op);
    OnEveryRank(size(), [&](int rank) {
      std::vector<T> data = Input<T>(offsets.back(), rank);
      ASSERT_TRUE(comm(rank).ReduceScatter(data.data(), counts, TypeOf<T>(), op).ok());
      std::vector<T> mine(data.begin() + offsets[rank], data.begin() + offsets[rank + 1]);
      std::vector<T> want(expected.begin() + offsets[rank], expected.begin() + offsets[rank + 1]);
      EXPECT_EQ(mine, want) << "rank " << rank;
    });
  }

  template <typename T>
  void CheckAllGather(const std::vector<size_t>& counts) {
    const std::vector<size_t> offsets = Offsets(counts);
    // Every element says which rank owns it and where it is: a misplaced chunk shows.
    std::vector<T> expected(offsets.back());
    for (int r = 0; r < size(); ++r) {
      for (size_t i = offsets[r]; i < offsets[r + 1]; ++i)
        expected[i] = static_cast<T>(r * 1000 + i % 997);
    }
    OnEveryRank(size(), [&](int rank) {
      std::vector<T> data(offsets.back(), T(-1));
      std::copy(expected.begin() + offsets[rank], expected.begin() + offsets[rank + 1],
                data.begin() + offsets[rank]);
      ASSERT_TRUE(comm(rank).AllGather(data.data(), counts, TypeOf<T>()).ok());
      EXPECT_EQ(data, expected) << "rank " << rank;
    });
  }

  std::unique_ptr<Group> group_;
};

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCommunicatorTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "Ranks"; });

TEST_P(GlooCommunicatorTest, AllReduceSumsAndAveragesExactly) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    CheckAllReduce<float>(1000, op);
    CheckAllReduce<double>(1000, op);
    CheckAllReduce<float>(1, op);  // fewer elements than ranks
  }
}

TEST_P(GlooCommunicatorTest, AllReduceOfZeroElementsIsANoOp) {
  OnEveryRank(size(), [&](int rank) {
    EXPECT_TRUE(comm(rank).AllReduce(nullptr, 0, DataType::kFloat32, ReduceOp::kSum).ok());
  });
}

TEST_P(GlooCommunicatorTest, AllReduceResultsAreBitwiseIdenticalOnEveryRank) {
  constexpr size_t kCount = 100'003;
  std::vector<std::vector<float>> results(size());
  OnEveryRank(size(), [&](int rank) {
    std::mt19937 rng(1234 + rank);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> data(kCount);
    for (float& x : data) x = normal(rng) * 1e3f;
    ASSERT_TRUE(
        comm(rank).AllReduce(data.data(), kCount, DataType::kFloat32, ReduceOp::kAverage).ok());
    results[rank] = std::move(data);
  });
  for (int rank = 1; rank < size(); ++rank) {
    ASSERT_EQ(results[rank].size(), kCount);
    EXPECT_EQ(std::memcmp(results[rank].data(), results[0].data(), kCount * sizeof(float)), 0)
        << "rank " << rank << " differs from rank 0";
  }
}

TEST_P(GlooCommunicatorTest, ReduceScatterLeavesEachRankItsReducedChunk) {
  std::vector<size_t> uneven(size());
  for (int r = 0; r < size(); ++r) uneven[r] = 10 + 7 * r;
  std::vector<size_t> with_zeros = uneven;
  with_zeros[0] = 0;
  with_zeros[size() - 1] = 0;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    CheckReduceScatter<float>(uneven, op);
    CheckReduceScatter<double>(uneven, op);
    CheckReduceScatter<float>(with_zeros, op);
    CheckReduceScatter<double>(std::vector<size_t>(size(), 0), op);
  }
}

TEST_P(GlooCommunicatorTest, ReduceScatterPipelinesChunksOfManySegments) {
  // Chunks of several 1 MiB segments with ragged tails, and an empty one.
  std::vector<size_t> counts(size());
  for (int r = 0; r < size(); ++r) counts[r] = (r == 1) ? 0 : 600'000 + 12'345 * r;
  CheckReduceScatter<float>(counts, ReduceOp::kSum);
  CheckReduceScatter<double>(counts, ReduceOp::kAverage);
}

TEST_P(GlooCommunicatorTest, AllGatherFillsEveryChunkInPlace) {
  std::vector<size_t> uneven(size());
  for (int r = 0; r < size(); ++r) uneven[r] = 3 + 5 * r;
  std::vector<size_t> with_zeros = uneven;
  with_zeros[size() / 2] = 0;
  CheckAllGather<float>(uneven);
  CheckAllGather<double>(uneven);
  CheckAllGather<float>(with_zeros);
  CheckAllGather<double>(std::vector<size_t>(size(), 0));
}

TEST_P(GlooCommunicatorTest, AllGatherPipelinesChunksOfManySegments) {
  std::vector<size_t> counts(size());
  for (int r = 0; r < size(); ++r) counts[r] = (r == size() - 1) ? 0 : 300'000 + 777 * r;
  CheckAllGather<double>(counts);
}

TEST_P(GlooCommunicatorTest, BroadcastCopiesTheRootsDataFromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    OnEveryRank(size(), [&](int rank) {
      std::vector<double> data = Input<double>(513, rank);
      ASSERT_TRUE(comm(rank).Broadcast(data.data(), data.size(), DataType::kFloat64, root).ok());
      EXPECT_EQ(data, Input<double>(513, root)) << "rank " << rank << " root " << root;
    });
  }
}

TEST_P(GlooCommunicatorTest, PointToPointMessagesArriveInOrderPerTag) {
  // Rank 0 sends three messages on tag 5 and one on tag 9 to every other rank, tag 9 last;
  // receivers take tag 9 first: order holds within a tag, and tags do not block each other.
  // (The second half is Gloo's: NCCL matches in call order, nccl_communicator.h.)
  OnEveryRank(size(), [&](int rank) {
    if (rank == 0) {
      std::vector<std::vector<int>> messages(size() * 4);
      std::vector<std::unique_ptr<Request>> requests;
      for (int peer = 1; peer < size(); ++peer) {
        for (int m = 0; m < 4; ++m) {
          std::vector<int>& msg = messages[peer * 4 + m];
          msg.assign(100 + m, peer * 10 + m);
          auto request = comm(0).Isend(msg.data(), msg.size() * sizeof(int), peer, m < 3 ? 5 : 9);
          ASSERT_TRUE(request.ok()) << request.status();
          requests.push_back(std::move(request).value());
        }
      }
      for (auto& request : requests) EXPECT_TRUE(request->Wait().ok());
    } else {
      std::vector<int> last(103);
      ASSERT_TRUE(comm(rank).Recv(last.data(), last.size() * sizeof(int), 0, 9).ok());
      EXPECT_EQ(last, std::vector<int>(103, rank * 10 + 3));
      for (int m = 0; m < 3; ++m) {
        std::vector<int> msg(100 + m);
        ASSERT_TRUE(comm(rank).Recv(msg.data(), msg.size() * sizeof(int), 0, 5).ok());
        EXPECT_EQ(msg, std::vector<int>(100 + m, rank * 10 + m)) << "message " << m;
      }
    }
  });
}

TEST_P(GlooCommunicatorTest, EmptyPointToPointMessagesAreDelivered) {
  OnEveryRank(size(), [&](int rank) {
    const int right = (rank + 1) % size(), left = (rank + size() - 1) % size();
    auto recv = comm(rank).Irecv(nullptr, 0, left, 1);
    ASSERT_TRUE(recv.ok()) << recv.status();
    EXPECT_TRUE(comm(rank).Send(nullptr, 0, right, 1).ok());
    EXPECT_TRUE((*recv)->Wait().ok());
  });
}

TEST_P(GlooCommunicatorTest, BarrierReturnsOnlyOnceEveryRankHasArrived) {
  std::atomic<int> arrived{0};
  OnEveryRank(size(), [&](int rank) {
    // The last rank is late; nobody may leave before it arrives.
    if (rank == size() - 1) std::this_thread::sleep_for(milliseconds(100));
    arrived.fetch_add(1);
    ASSERT_TRUE(comm(rank).Barrier().ok());
    EXPECT_EQ(arrived.load(), size()) << "rank " << rank << " left the barrier early";
  });
}

TEST_P(GlooCommunicatorTest, WaitSecondsIsTheTimeEachRankSpentWaitingForTheLateOne) {
  // The last rank comes 300 ms late to a Gloo all-reduce and to a ring reduce-scatter (a
  // collective of drover's own, on the group's Run too): every other rank waits about
  // 600 ms in them, the late one little. Time spent outside the calls is not counted.
  constexpr milliseconds kLate{300};
  std::vector<double> waited(size());
  OnEveryRank(size(), [&](int rank) {
    EXPECT_EQ(comm(rank).wait_seconds(), 0);
    std::vector<float> data = Input<float>(1000, rank);
    if (rank == size() - 1) std::this_thread::sleep_for(kLate);
    ASSERT_TRUE(
        comm(rank).AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum).ok());
    if (rank == size() - 1) std::this_thread::sleep_for(kLate);
    const std::vector<size_t> counts(size(), 1000 / size());
    ASSERT_TRUE(
        comm(rank).ReduceScatter(data.data(), counts, DataType::kFloat32, ReduceOp::kSum).ok());
    waited[rank] = comm(rank).wait_seconds();
  });
  const double late = waited[size() - 1];
  for (int rank = 0; rank < size() - 1; ++rank) {
    EXPECT_GE(waited[rank], 0.55) << "rank " << rank;
    EXPECT_LT(late, waited[rank] - 0.4) << "rank " << rank << " waited " << waited[rank];
  }
}

TEST_P(GlooCommunicatorTest, CallsBesideComputeCountOnlyWhatTheCallerBlockedForThem) {
  // As a gradient bucket's reduction: an all-reduce on a CommStream while the rank computes
  // (sleeps) 200 ms. The last rank comes 300 ms late, so the others' calls take about
  // 300 ms, of which their training threads block for about 100. That is what they waited;
  // the group counts none of it itself.
  constexpr milliseconds kLate{300}, kCompute{200};
  std::vector<double> stalls(size()), group_waits(size());
  OnEveryRank(size(), [&](int rank) {
    CommStream stream("dp reduction");
    std::vector<float> data = Input<float>(1000, rank);
    if (rank == size() - 1) std::this_thread::sleep_for(kLate);
    const CommStream::Ticket t = stream.Submit([&] {
      return comm(rank).AllReduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    });
    if (rank != size() - 1) std::this_thread::sleep_for(kCompute);
    ASSERT_TRUE(stream.Wait(t).ok());
    stalls[rank] = stream.overlapped_waits_seconds();
    group_waits[rank] = comm(rank).wait_seconds();
  });
  for (int rank = 0; rank < size(); ++rank) {
    EXPECT_EQ(group_waits[rank], 0) << "rank " << rank;
    if (rank == size() - 1) {
      EXPECT_LT(stalls[rank], 0.05) << "the late rank";
    } else {
      EXPECT_GE(stalls[rank], 0.05) << "rank " << rank;
      EXPECT_LT(stalls[rank], 0.2) << "rank " << rank << ": its compute counted as waiting";
    }
  }
}

TEST_P(GlooCommunicatorTest, ConsecutiveOperationsOfEveryKindDoNotMix) {
  // Back to back, without barriers, with point-to-point traffic between the collectives:
  // a message matched to the wrong operation would corrupt one of the results.
  const std::vector<size_t> counts(size(), 64);
  const std::vector<float> expected = Reference<float>(64 * size(), size(), ReduceOp::kSum);
  OnEveryRank(size(), [&](int rank) {
    const int right = (rank + 1) % size(), left = (rank + size() - 1) % size();
    for (int round = 0; round < 20; ++round) {
      std::vector<float> a = Input<float>(64 * size(), rank), b = a;
      int sent = rank * 100 + round, got = -1;
      auto recv = comm(rank).Irecv(&got, sizeof(got), left, round);
      ASSERT_TRUE(recv.ok());
      ASSERT_TRUE(
          comm(rank).AllReduce(a.data(), a.size(), DataType::kFloat32, ReduceOp::kSum).ok());
      ASSERT_TRUE(comm(rank).Send(&sent, sizeof(sent), right, round).ok());
      ASSERT_TRUE(
          comm(rank).ReduceScatter(b.data(), counts, DataType::kFloat32, ReduceOp::kSum).ok());
      ASSERT_TRUE(comm(rank).AllGather(b.data(), counts, DataType::kFloat32).ok());
      ASSERT_TRUE((*recv)->Wait().ok());
      EXPECT_EQ(a, expected);
      EXPECT_EQ(b, expected);
      EXPECT_EQ(got, left * 100 + round);
    }
  });
}

TEST(GlooCommunicatorSingleRankTest, GroupOfOneNeedsNoSocketsAndLeavesDataAsIs) {
  auto comm = ConnectGlooGroup(nullptr, nullptr, "solo", 0, 1, CommOptions{}, kConnectTimeout);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> data = {1.5f, -2.f, 3.f};
  const std::vector<float> original = data;
  const std::vector<size_t> counts = {3};
  EXPECT_TRUE((*comm)->AllReduce(data.data(), 3, DataType::kFloat32, ReduceOp::kAverage).ok());
  EXPECT_TRUE((*comm)->ReduceScatter(data.data(), counts, DataType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_TRUE((*comm)->AllGather(data.data(), counts, DataType::kFloat32).ok());
  EXPECT_TRUE((*comm)->Broadcast(data.data(), 3, DataType::kFloat32, 0).ok());
  EXPECT_TRUE((*comm)->Barrier().ok());
  EXPECT_EQ(data, original);
  EXPECT_EQ((*comm)->rank(), 0);
  EXPECT_EQ((*comm)->size(), 1);
  EXPECT_EQ((*comm)->name(), "solo");
}

TEST(GlooCommunicatorConnectTest, GroupsWithDifferentNamesShareOneStoreAndTransport) {
  // Ranks 0..3 form "world" and, at the same time, "even" (0, 2) and "odd" (1, 3), all
  // through one transport per rank and one store.
  InMemoryKvStore store;
  std::vector<std::shared_ptr<GlooTransport>> transports;
  for (int r = 0; r < 4; ++r) transports.push_back(*GlooTransport::Create("127.0.0.1"));
  OnEveryRank(4, [&](int rank) {
    auto world = ConnectGlooGroup(transports[rank], &store, "world", rank, 4, CommOptions{},
                                  kConnectTimeout);
    auto half = ConnectGlooGroup(transports[rank], &store, rank % 2 ? "odd" : "even", rank / 2, 2,
                                 CommOptions{}, kConnectTimeout);
    ASSERT_TRUE(world.ok()) << world.status();
    ASSERT_TRUE(half.ok()) << half.status();
    double w = rank, h = rank;
    ASSERT_TRUE((*world)->AllReduce(&w, 1, DataType::kFloat64, ReduceOp::kSum).ok());
    ASSERT_TRUE((*half)->AllReduce(&h, 1, DataType::kFloat64, ReduceOp::kSum).ok());
    EXPECT_EQ(w, 6.0);
    EXPECT_EQ(h, rank % 2 ? 4.0 : 2.0);
  });
}

TEST(GlooCommunicatorConnectTest, MissingPeerFailsWithDeadlineExceededWithinConnectTimeout) {
  constexpr milliseconds kTimeout{500};
  InMemoryKvStore store;
  std::vector<std::shared_ptr<GlooTransport>> transports;
  for (int r = 0; r < 2; ++r) transports.push_back(*GlooTransport::Create("127.0.0.1"));
  OnEveryRank(2, [&](int rank) {  // rank 2 of 3 never comes
    const auto start = Clock::now();
    auto comm = ConnectGlooGroup(transports[rank], &store, "g", rank, 3, CommOptions{}, kTimeout);
    const auto elapsed = Clock::now() - start;
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status();
    EXPECT_NE(comm.status().message().find("g/gloo/2"), std::string::npos) << comm.status();
    EXPECT_LT(elapsed, kTimeout + milliseconds(500));
  });
}

// One collective of every kind, as rank `rank` calls it; Recv stands for point to point
// (every rank receives from its right neighbour, which never sends).
using Collective = std::function<Status(Communicator&, int rank)>;

std::vector<std::pair<std::string, Collective>> EveryKindOfCall() {
  static std::vector<float> buffers[8];
  auto data = [](int rank) {
    buffers[rank].assign(1 << 20, 1.f);
    return buffers[rank].data();
  };
  return {
      {"AllReduce",
       [=](Communicator& c, int r) {
         return c.AllReduce(data(r), 1 << 20, DataType::kFloat32, ReduceOp::kSum);
       }},
      {"ReduceScatter",
       [=](Communicator& c, int r) {
         std::vector<size_t> counts(c.size(), (1 << 20) / c.size());
         return c.ReduceScatter(data(r), counts, DataType::kFloat32, ReduceOp::kSum);
       }},
      {"AllGather",
       [=](Communicator& c, int r) {
         std::vector<size_t> counts(c.size(), (1 << 20) / c.size());
         return c.AllGather(data(r), counts, DataType::kFloat32);
       }},
      {"Broadcast",
       [=](Communicator& c, int r) {
         // Rooted at the rank that fails, so that every other rank waits on it.
         return c.Broadcast(data(r), 1 << 20, DataType::kFloat32, c.size() - 1);
       }},
      {"Barrier", [](Communicator& c, int) { return c.Barrier(); }},
      {"Recv",
       [=](Communicator& c, int r) { return c.Recv(data(r), 1024, (r + 1) % c.size(), 77); }},
  };
}

bool IsPeerFailure(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

TEST(GlooCommunicatorFailureTest, PeerThatNeverJoinsGivesDeadlineExceededWithinTheTimeout) {
  constexpr milliseconds kTimeout{300};
  for (const auto& [name, call] : EveryKindOfCall()) {
    auto group = ConnectGroup(2, kTimeout);
    std::promise<void> rank0_done;
    OnEveryRank(2, [&](int rank) {
      if (rank == 1) {  // alive, connected, but never calls
        rank0_done.get_future().wait();
        return;
      }
      const auto start = Clock::now();
      Status s = call(*group->comms[0], 0);
      const auto elapsed = Clock::now() - start;
      rank0_done.set_value();
      EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << name << ": " << s;
      EXPECT_NE(s.message().find("\"g\""), std::string::npos) << s;
      EXPECT_NE(s.message().find(name == "Recv" ? "Irecv" : name), std::string::npos) << s;
      EXPECT_GE(elapsed, kTimeout - milliseconds(50)) << name;
      EXPECT_LT(elapsed, kTimeout + milliseconds(700)) << name;
    });
  }
}

TEST(GlooCommunicatorFailureTest, PeerThatDiesBetweenCallsFailsTheOthersWithinTheTimeout) {
  // The last rank leaves (its communicator is destroyed) while the others are in the next
  // collective: they fail, Unavailable or DeadlineExceeded, and none waits past its timeout.
  constexpr milliseconds kTimeout{1'500};
  for (int size : {2, 3, 4}) {
    for (const auto& [name, call] : EveryKindOfCall()) {
      auto group = ConnectGroup(size, kTimeout);
      OnEveryRank(size, [&](int rank) {
        Communicator& comm = *group->comms[rank];
        ASSERT_TRUE(comm.Barrier().ok());
        if (rank == size - 1) {
          std::this_thread::sleep_for(milliseconds(50));  // let the others enter the call
          group->comms[rank].reset();
          return;
        }
        const auto start = Clock::now();
        Status s = call(comm, rank);
        const auto elapsed = Clock::now() - start;
        EXPECT_TRUE(IsPeerFailure(s)) << size << " ranks, " << name << ": " << s;
        EXPECT_LT(elapsed, kTimeout + milliseconds(700)) << size << " ranks, " << name;
      });
    }
  }
}

TEST(GlooCommunicatorFailureTest, BrokenCommunicatorFailsEveryLaterCallAtOnceWithTheFirstError) {
  constexpr milliseconds kTimeout{300};
  auto group = ConnectGroup(2, kTimeout);
  std::promise<void> rank0_done;
  OnEveryRank(2, [&](int rank) {
    if (rank == 1) {
      rank0_done.get_future().wait();
      return;
    }
    Communicator& comm = *group->comms[0];
    double x = 1;
    const Status first = comm.AllReduce(&x, 1, DataType::kFloat64, ReduceOp::kSum);
    rank0_done.set_value();
    ASSERT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first;
    const auto start = Clock::now();
    std::vector<size_t> counts = {1, 1};
    double pair[2] = {1, 2};
    EXPECT_EQ(comm.AllReduce(&x, 1, DataType::kFloat64, ReduceOp::kSum), first);
    EXPECT_EQ(comm.ReduceScatter(pair, counts, DataType::kFloat64, ReduceOp::kSum), first);
    EXPECT_EQ(comm.AllGather(pair, counts, DataType::kFloat64), first);
    EXPECT_EQ(comm.Broadcast(&x, 1, DataType::kFloat64, 1), first);
    EXPECT_EQ(comm.Barrier(), first);
    EXPECT_EQ(comm.Isend(&x, sizeof(x), 1, 0).status(), first);
    EXPECT_EQ(comm.Recv(&x, sizeof(x), 1, 0), first);
    EXPECT_LT(Clock::now() - start, milliseconds(50));
  });
}

}  // namespace
}  // namespace drover::engine::parallel
