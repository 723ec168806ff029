#include "worker/engine/parallel/peer_check.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

namespace drover::engine::parallel {
namespace {

// A loopback port nothing listens on (bound, then closed): connecting to it is refused.
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

PeerCheckOptions Fast() {
  PeerCheckOptions o;
  o.arrival_timeout = std::chrono::seconds(20);
  o.probe_timeout = std::chrono::seconds(5);
  return o;
}

TEST(PeerCheckTest, RanksThatReachEachOtherFindNothingCutOff) {
  InMemoryKvStore store;
  constexpr int kSize = 3;
  std::vector<StatusOr<PeerCheckResult>> results(kSize, InternalError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < kSize; ++r) {
    ranks.emplace_back([&, r] { results[r] = CheckPeers(&store, r, kSize, Fast()); });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kSize; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(results[r]->unreachable, Reachability(kSize)) << "rank " << r;
    EXPECT_EQ(results[r]->addresses, results[0]->addresses);
    EXPECT_TRUE(CutOffRanks(results[r]->unreachable).empty());
  }
  EXPECT_EQ(results[0]->addresses[1].rfind("127.0.0.1:", 0), 0u) << results[0]->addresses[1];
}

// Rank 2 publishes an address nobody can connect to (its findings say it reached everyone):
// the two real ranks each find it unreachable, and every rank's verdict names it alone.
TEST(PeerCheckTest, ARankItsPeersCannotReachIsNamedCutOff) {
  InMemoryKvStore store;
  ASSERT_TRUE(store.Set("peers/addr/2", "127.0.0.1:" + std::to_string(ClosedPort())).ok());
  ASSERT_TRUE(store.Set("peers/result/2", "none").ok());
  std::vector<StatusOr<PeerCheckResult>> results(2, InternalError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] { results[r] = CheckPeers(&store, r, 3, Fast()); });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << results[r].status();
    EXPECT_EQ(results[r]->unreachable, (Reachability{{2}, {2}, {}}));
    EXPECT_EQ(CutOffRanks(results[r]->unreachable), std::vector<int>{2});
  }
  const std::string text = DescribeReachability(*results[0]);
  EXPECT_NE(text.find("rank 0 (127.0.0.1:"), std::string::npos) << text;
  EXPECT_NE(text.find("could not reach rank 2"), std::string::npos) << text;
}

TEST(PeerCheckTest, ARankThatNeverPublishesIsADeadlineNamingIt) {
  InMemoryKvStore store;
  PeerCheckOptions o = Fast();
  o.arrival_timeout = std::chrono::milliseconds(100);
  const StatusOr<PeerCheckResult> result = CheckPeers(&store, 0, 2, o);
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_NE(result.status().message().find("peers/addr/1"), std::string::npos) << result.status();
}

TEST(PeerCheckTest, MalformedFindingsAreRefused) {
  InMemoryKvStore store;
  ASSERT_TRUE(store.Set("peers/addr/1", "127.0.0.1:" + std::to_string(ClosedPort())).ok());
  ASSERT_TRUE(store.Set("peers/result/1", "0,7").ok());  // rank 7 of 2
  const StatusOr<PeerCheckResult> result = CheckPeers(&store, 0, 2, Fast());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument) << result.status();
}

TEST(PeerCheckTest, CutOffRanksCoverEveryFailedPairWithTheFewestRanks) {
  // Nothing failed.
  EXPECT_TRUE(CutOffRanks(Reachability(4)).empty());
  // Rank 1's node lost its network: it reaches nobody and nobody reaches it.
  EXPECT_EQ(CutOffRanks({{1}, {0, 2, 3}, {1}, {1}}), std::vector<int>{1});
  // Only one side noticed: the same verdict from either side's findings alone.
  EXPECT_EQ(CutOffRanks({{}, {0, 2, 3}, {}, {}}), std::vector<int>{1});
  EXPECT_EQ(CutOffRanks({{1}, {}, {1}, {1}}), std::vector<int>{1});
  // One broken link between ranks 2 and 3: one of its ends (the lower on a tie).
  EXPECT_EQ(CutOffRanks({{}, {}, {3}, {2}}), std::vector<int>{2});
  // Two nodes cut off (ranks 0 and 3 of 5); between them a pair that failed too.
  EXPECT_EQ(CutOffRanks({{1, 2, 3, 4}, {0, 3}, {0, 3}, {0, 1, 2, 4}, {0, 3}}),
            (std::vector<int>{0, 3}));
}

}  // namespace
}  // namespace drover::engine::parallel
