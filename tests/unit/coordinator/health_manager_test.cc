#include "coordinator/health_manager.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace drover::coordinator
