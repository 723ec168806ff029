#include "cli/retry.h"

#include <gtest/gtest.h>

#include <vector>

namespace drover::cli {
namespace {

// Time passes only when the code under test sleeps (and by what each call costs).
struct FakeTime {
  int64_t now = 0;
  std::vector<int64_t> sleeps;
  RetryEnv Env(double jitter = 1.0) {
    return {[this] { return now; },
            [this](int64_t ms) {
              sleeps.push_back(ms);
              now += ms;
            },
            [jitter] { return jitter; }};
  }
};

TEST(RetryTest, RetriesUnavailableWithDoublingCappedDelaysUntilItSucceeds) {
  FakeTime t;
  int calls = 0;
  Status st = Retry({10'000, 100, 400}, t.Env(),
                    [&] { return ++calls < 5 ? UnavailableError("down") : OkStatus(); });
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(t.sleeps, (std::vector<int64_t>{100, 200, 400, 400}));
}

TEST(RetryTest, OtherErrorsAreReturnedAtOnce) {
  FakeTime t;
  int calls = 0;
  Status st = Retry({}, t.Env(), [&] {
    ++calls;
    return NotFoundError("no job x");
  });
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(t.sleeps.empty());
}

TEST(RetryTest, GivesUpWithTheLastErrorWhenTheNextTryWouldStartPastTheDeadline) {
  FakeTime t;
  int calls = 0;
  Status st = Retry({1'000, 100, 10'000}, t.Env(), [&] {
    t.now += 50;  // each try costs 50 ms
    return UnavailableError("down " + std::to_string(++calls));
  });
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  // Tries at 0, 150, 400, 850 (ending at 900); the next would start at 1700.
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(st.message(), "down 4");
  EXPECT_LE(t.now, 1'000);
}

TEST(RetryTest, JitterShortensEachDelay) {
  FakeTime t;
  int calls = 0;
  (void)Retry({10'000, 100, 1'000}, t.Env(0.5),
              [&] { return ++calls < 3 ? UnavailableError("down") : OkStatus(); });
  EXPECT_EQ(t.sleeps, (std::vector<int64_t>{50, 100}));
}

}  // namespace
}  // namespace drover::cli
