#include "coordinator/rendezvous.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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
