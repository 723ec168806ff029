#include "coordinator/rendezvous.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/clock.h"

namespace drover::coordinator {
namespace {

TEST(RendezvousTest, SetGetAdd) {
  RendezvousStore kv;
  kv.OpenAttempt("j", 1);
  ASSERT_TRUE(kv.Set("j", 1, "nccl_id", "abc").ok());
  EXPECT_EQ(kv.Get("j", 1, "nccl_id")->value(), "abc");
  EXPECT_FALSE(kv.Get("j", 1, "other")->has_value());
  EXPECT_EQ(*kv.Add("j", 1, "count", 1), 1);
  EXPECT_EQ(*kv.Add("j", 1, "count", 5), 6);
  EXPECT_EQ(kv.Get("j", 1, "count")->value(), "6");
  EXPECT_EQ(kv.Add("j", 1, "nccl_id", 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(RendezvousTest, OldAttemptIsRefusedAndItsNamespaceFreed) {
  RendezvousStore kv;
  EXPECT_EQ(kv.Set("j", 1, "k", "v").code(), StatusCode::kNotFound);
  kv.OpenAttempt("j", 1);
  ASSERT_TRUE(kv.Set("j", 1, "k", "v").ok());
  kv.OpenAttempt("j", 2);
  EXPECT_EQ(kv.Set("j", 1, "k", "v").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(kv.Get("j", 1, "k").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(kv.Get("j", 2, "k")->has_value());  // a fresh namespace
  kv.OpenAttempt("j", 1);                          // never reopens an older attempt
  EXPECT_EQ(kv.Get("j", 1, "k").status().code(), StatusCode::kFailedPrecondition);
  kv.CloseAttempt("j", 2);
  EXPECT_EQ(kv.Add("j", 2, "k", 1).status().code(), StatusCode::kFailedPrecondition);
}

// A new attempt's leases start only once the earlier attempt's have lapsed (lease_ms and a
// tenth more from when it stopped being served), so that a superseded trainer still
// holding one and its successor never publish at once; its keys are served at once (a key
// named like the lease's too: a lease is a call of its own, not a key).
TEST(RendezvousTest, ANewAttemptsLeasesStartOnceTheEarlierOnesHaveLapsed) {
  FakeClock clock;
  RendezvousStore kv(&clock, 1000);
  kv.OpenAttempt("j", 1);  // the first attempt: none before it
  ASSERT_TRUE(kv.ConfirmLease("j", 1).ok());
  clock.AdvanceMs(5000);
  kv.OpenAttempt("j", 2);  // superseding attempt 1 now
  ASSERT_TRUE(kv.Set("j", 2, "rank0", "addr").ok());
  ASSERT_TRUE(kv.Set("j", 2, "lease/0", "a key like any other").ok());
  const Status early = kv.ConfirmLease("j", 2);
  EXPECT_EQ(early.code(), StatusCode::kUnavailable) << early;
  EXPECT_EQ(early.message(),
            "rendezvous: attempt 2 of job j may confirm its lease in 1100 ms, once the earlier "
            "attempt's leases have lapsed");
  clock.AdvanceMs(1099);
  EXPECT_EQ(kv.ConfirmLease("j", 2).code(), StatusCode::kUnavailable);
  clock.AdvanceMs(1);
  EXPECT_TRUE(kv.ConfirmLease("j", 2).ok());
  // Closed (a failure), then a new attempt 3 s later: its leases start at once, attempt 2's
  // having lapsed meanwhile; one opened 0.5 s after a close waits the rest.
  kv.CloseAttempt("j", 2);
  clock.AdvanceMs(3000);
  kv.OpenAttempt("j", 3);
  EXPECT_TRUE(kv.ConfirmLease("j", 3).ok());
  kv.CloseAttempt("j", 3);
  clock.AdvanceMs(500);
  kv.OpenAttempt("j", 4);
  EXPECT_EQ(kv.ConfirmLease("j", 4).code(), StatusCode::kUnavailable);
  clock.AdvanceMs(600);
  EXPECT_TRUE(kv.ConfirmLease("j", 4).ok());
  EXPECT_EQ(kv.ConfirmLease("j", 3).code(), StatusCode::kFailedPrecondition);  // superseded
  // A coordinator restored from its state opens a later attempt first: when the one before
  // it ended is not known, its leases wait a whole lease from now.
  RendezvousStore restored(&clock, 1000);
  restored.OpenAttempt("j", 4);
  EXPECT_EQ(restored.ConfirmLease("j", 4).code(), StatusCode::kUnavailable);
  clock.AdvanceMs(1100);
  EXPECT_TRUE(restored.ConfirmLease("j", 4).ok());
}

TEST(RendezvousTest, WaitTimesOutNamingMissingKeys) {
  RendezvousStore kv;
  kv.OpenAttempt("j", 1);
  ASSERT_TRUE(kv.Set("j", 1, "a", "1").ok());
  Status st = kv.Wait("j", 1, {"a", "b"}, 20);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find(": b"), std::string::npos);
  EXPECT_TRUE(kv.Wait("j", 1, {"a"}, 0).ok());
}

TEST(RendezvousTest, WaitWakesWhenKeyIsSetOrAttemptEnds) {
  RendezvousStore kv;
  kv.OpenAttempt("j", 1);
  Status woke;
  std::thread waiter([&] { woke = kv.Wait("j", 1, {"rank0"}, 60'000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(kv.Set("j", 1, "rank0", "addr").ok());
  waiter.join();  // returns at once, long before its 60 s timeout
  EXPECT_TRUE(woke.ok()) << woke;

  std::thread fenced([&] { woke = kv.Wait("j", 1, {"never"}, 60'000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  kv.OpenAttempt("j", 2);
  fenced.join();
  EXPECT_EQ(woke.code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace drover::coordinator
