#include "coordinator/health_manager.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "common/clock.h"

namespace drover::coordinator {
namespace {

TEST(HealthManagerTest, NodeDeadAfterTimeoutAndNotBefore) {
  FakeClock clock;
  HealthManager h(3000);
  h.OnHeartbeat("n1", clock.NowMs());
  clock.AdvanceMs(2999);
  EXPECT_TRUE(h.Tick(clock.NowMs()).dead_nodes.empty());
  clock.AdvanceMs(1);
  EXPECT_EQ(h.Tick(clock.NowMs()).dead_nodes, std::vector<std::string>{"n1"});
  // Reported once.
  clock.AdvanceMs(5000);
  EXPECT_TRUE(h.Tick(clock.NowMs()).dead_nodes.empty());
}

TEST(HealthManagerTest, HeartbeatRenewsTheLease) {
  FakeClock clock;
  HealthManager h(3000);
  for (int i = 0; i < 10; ++i) {
    h.OnHeartbeat("n1", clock.NowMs());
    clock.AdvanceMs(1000);
    EXPECT_TRUE(h.Tick(clock.NowMs()).dead_nodes.empty());
  }
}

TEST(HealthManagerTest, LostConnectionShortensTheLeaseUnlessAHeartbeatFollows) {
  FakeClock clock;
  HealthManager h(3000);
  h.OnHeartbeat("n1", clock.NowMs());
  h.OnHeartbeat("n2", clock.NowMs());
  clock.AdvanceMs(100);
  h.OnConnectionLost("n1", clock.NowMs(), 500);
  h.OnConnectionLost("n2", clock.NowMs(), 500);
  h.OnConnectionLost("unknown", clock.NowMs(), 500);  // never heard of: nothing to shorten
  clock.AdvanceMs(200);
  h.OnHeartbeat("n2", clock.NowMs());  // alive: it heartbeat at once after the break
  clock.AdvanceMs(299);
  EXPECT_TRUE(h.Tick(clock.NowMs()).dead_nodes.empty());
  clock.AdvanceMs(1);
  EXPECT_EQ(h.Tick(clock.NowMs()).dead_nodes, std::vector<std::string>{"n1"});
  clock.AdvanceMs(2699);  // n2's heartbeat at 300 renewed it to 3300
  EXPECT_TRUE(h.Tick(clock.NowMs()).dead_nodes.empty());
  clock.AdvanceMs(1);
  EXPECT_EQ(h.Tick(clock.NowMs()).dead_nodes, std::vector<std::string>{"n2"});
  // A grace longer than what is left of the lease changes nothing.
  h.OnHeartbeat("n3", clock.NowMs());
  clock.AdvanceMs(2900);
  h.OnConnectionLost("n3", clock.NowMs(), 500);
  clock.AdvanceMs(100);
  EXPECT_EQ(h.Tick(clock.NowMs()).dead_nodes, std::vector<std::string>{"n3"});
}

TEST(HealthManagerTest, TrainerHangsWhenStepDoesNotMove) {
  FakeClock clock;
  HealthManager h(3000);
  TrainerKey k{"j", 1, 0};
  h.OnTrainerProgress(k, 5, 10'000, clock.NowMs());
  clock.AdvanceMs(6000);
  h.OnTrainerProgress(k, 6, 10'000, clock.NowMs());  // moved: the clock restarts
  clock.AdvanceMs(9999);
  h.OnTrainerProgress(k, 6, 10'000, clock.NowMs());  // same step: no restart
  EXPECT_TRUE(h.Tick(clock.NowMs()).hung.empty());
  clock.AdvanceMs(1);
  auto events = h.Tick(clock.NowMs());
  ASSERT_EQ(events.hung.size(), 1u);
  EXPECT_EQ(events.hung[0], k);
}

// A trainer evaluating for longer than the timeout reports work between its steps: each
// change of that count restarts the clock as a step does; once it stops, the trainer hangs.
TEST(HealthManagerTest, WorkBetweenStepsKeepsATrainerFromHanging) {
  FakeClock clock;
  HealthManager h(3000);
  TrainerKey k{"j", 1, 0};
  h.OnTrainerProgress(k, 5, 10'000, clock.NowMs(), 0);
  for (int64_t work = 1; work <= 5; ++work) {
    clock.AdvanceMs(9000);
    h.OnTrainerProgress(k, 5, 10'000, clock.NowMs(), work);  // 45 s on one step
    EXPECT_TRUE(h.Tick(clock.NowMs()).hung.empty()) << work;
  }
  clock.AdvanceMs(9999);
  h.OnTrainerProgress(k, 5, 10'000, clock.NowMs(), 5);  // the same count: no restart
  EXPECT_TRUE(h.Tick(clock.NowMs()).hung.empty());
  clock.AdvanceMs(1);
  EXPECT_EQ(h.Tick(clock.NowMs()).hung, std::vector<TrainerKey>{k});
}

TEST(HealthManagerTest, ForgottenAttemptsAndDisabledTimeoutNeverHang) {
  FakeClock clock;
  HealthManager h(3000);
  h.OnTrainerProgress({"j", 1, 0}, 1, 1000, clock.NowMs());
  h.OnTrainerProgress({"j", 1, 1}, 1, 1000, clock.NowMs());
  h.OnTrainerProgress({"k", 1, 0}, 1, 0, clock.NowMs());  // 0: disabled
  h.ForgetAttempt("j", 1);
  clock.AdvanceMs(100'000);
  EXPECT_TRUE(h.Tick(clock.NowMs()).hung.empty());
}

TEST(HealthManagerTest, ForgottenNodeThatComesBackGetsAFreshLease) {
  FakeClock clock;
  HealthManager h(3000);
  h.OnHeartbeat("n1", clock.NowMs());
  clock.AdvanceMs(1000);
  h.ForgetNode("n1");
  h.OnHeartbeat("n1", clock.NowMs());  // lease to t=4000; the forgotten check was due at 3000
  clock.AdvanceMs(2500);
  EXPECT_TRUE(h.Tick(clock.NowMs()).dead_nodes.empty());
  clock.AdvanceMs(500);
  EXPECT_EQ(h.Tick(clock.NowMs()).dead_nodes, std::vector<std::string>{"n1"});
}

TEST(HealthManagerTest, DeadNodeThatHeartbeatsAgainIsWatchedAgain) {
  FakeClock clock;
  HealthManager h(3000);
  h.OnHeartbeat("n1", clock.NowMs());
  clock.AdvanceMs(3000);
  EXPECT_EQ(h.Tick(clock.NowMs()).dead_nodes.size(), 1u);
  h.OnHeartbeat("n1", clock.NowMs());
  clock.AdvanceMs(3000);
  EXPECT_EQ(h.Tick(clock.NowMs()).dead_nodes, std::vector<std::string>{"n1"});
}

TEST(HealthManagerTest, ShorterHangTimeoutTakesEffectAtOnce) {
  FakeClock clock;
  HealthManager h(3000);
  TrainerKey k{"j", 1, 0};
  h.OnTrainerProgress(k, 1, 60'000, clock.NowMs());
  h.OnTrainerProgress(k, 1, 5'000, clock.NowMs());
  clock.AdvanceMs(5000);
  EXPECT_EQ(h.Tick(clock.NowMs()).hung, std::vector<TrainerKey>{k});
}

// The checks in a heap must report exactly what scanning every lease and every trainer at
// each tick reports: random heartbeats, steps, forgets and ticks against that reference.
TEST(HealthManagerTest, MatchesAFullScanUnderRandomTraffic) {
  FakeClock clock;
  const int64_t timeout = 3000;
  HealthManager h(timeout);
  std::map<std::string, int64_t> lease;  // reference: node -> deadline
  struct Ref {
    int64_t step, moved, timeout;
  };
  std::map<TrainerKey, Ref> progress;
  std::mt19937 rng(7);
  auto pick = [&](int n) { return static_cast<int>(rng() % n); };
  std::vector<std::string> nodes, jobs;
  // (Names built with append: GCC 12 warns falsely on "literal" + std::to_string here.)
  for (int i = 0; i < 20; ++i) nodes.push_back(std::string("n").append(std::to_string(i)));
  for (int i = 0; i < 3; ++i) jobs.push_back(std::string("j").append(std::to_string(i)));
  for (int round = 0; round < 20'000; ++round) {
    const int64_t now = clock.NowMs();
    switch (pick(8)) {
      case 0:
      case 1: {
        const std::string& node = nodes[pick(20)];
        h.OnHeartbeat(node, now);
        lease[node] = now + timeout;
        break;
      }
      case 2:
      case 3: {
        const TrainerKey key{jobs[pick(3)], pick(3), pick(4)};
        const int64_t step = pick(3), t = 1000 * (1 + pick(5));
        h.OnTrainerProgress(key, step, t, now);
        auto [it, inserted] = progress.try_emplace(key, Ref{step, now, t});
        if (!inserted && it->second.step != step) it->second = Ref{step, now, t};
        it->second.timeout = t;
        break;
      }
      case 4: {
        const std::string& node = nodes[pick(20)];
        h.ForgetNode(node);
        lease.erase(node);
        break;
      }
      case 5: {
        const TrainerKey key{jobs[pick(3)], pick(3), pick(4)};
        if (pick(2) == 0) {
          h.ForgetTrainer(key);
          progress.erase(key);
        } else {
          h.ForgetAttempt(key.job_id, key.attempt);
          std::erase_if(progress, [&](const auto& e) {
            return e.first.job_id == key.job_id && e.first.attempt == key.attempt;
          });
        }
        break;
      }
      default: {
        clock.AdvanceMs(pick(700));
        const int64_t t = clock.NowMs();
        HealthManager::Events want;
        std::erase_if(lease, [&](const auto& e) {
          if (t < e.second) return false;
          want.dead_nodes.push_back(e.first);
          return true;
        });
        std::erase_if(progress, [&](const auto& e) {
          if (t - e.second.moved < e.second.timeout) return false;
          want.hung.push_back(e.first);
          return true;
        });
        HealthManager::Events got = h.Tick(t);
        ASSERT_EQ(got.dead_nodes, want.dead_nodes) << "round " << round;
        ASSERT_EQ(got.hung, want.hung) << "round " << round;
      }
    }
  }
}

}  // namespace
}  // namespace drover::coordinator
