#include "worker/call_within.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

namespace drover {
namespace {

// A call that returns in time gives its result.
TEST(CallWithinTest, ACallThatReturnsInTimeGivesItsResult) {
  std::optional<std::string> got =
      CallWithin<std::string>([] { return std::string("cuda:0 NVIDIA H200"); }, 10'000);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, "cuda:0 NVIDIA H200");
}

// A call that has not returned by the timeout is given up on: the caller goes on at once,
// and the call, when it does return, finishes on its own thread with nobody waiting.
TEST(CallWithinTest, ACallThatDoesNotReturnInTimeIsGivenUpOn) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const auto start = std::chrono::steady_clock::now();
  std::optional<int> got = CallWithin<int>(
      [released, finished] {
        released.wait();  // as a wedged driver holds its caller
        *finished = true;
        return 7;
      },
      50);
  EXPECT_FALSE(got.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  release.set_value();
  for (int i = 0; i < 2000 && !*finished; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(*finished);
}

}  // namespace
}  // namespace drover
