// CommStream: work in submission order on its own thread, and what the caller stalled for it.
#include "worker/engine/parallel/comm_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace drover::engine::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A device that runs behind the host: the work marked at a MarkWork finishes `backlog` after
// it (as a GPU still running the backward the host enqueued).
class DeviceBehindTheHost final : public WorkMarks {
 public:
  explicit DeviceBehindTheHost(milliseconds backlog) : backlog_(backlog) {}
  void MarkWork() override {
    ++marks_;
    done_at_ = Clock::now() + backlog_;
  }
  bool MarkedWorkDone() override { return Clock::now() >= done_at_; }
  int marks() const { return marks_; }

 private:
  const milliseconds backlog_;
  int marks_ = 0;
  Clock::time_point done_at_{};
};

// Work that takes `ms` (a reduction whose last peer comes late).
CommStream::Ticket SubmitTaking(CommStream& stream, milliseconds ms) {
  return stream.Submit([ms] {
    std::this_thread::sleep_for(ms);
    return OkStatus();
  });
}

TEST(CommStreamTest, WorkRunsInSubmissionOrderAndTheFirstErrorSticks) {
  CommStream stream("test");
  std::vector<int> ran;
  stream.Submit([&] {
    ran.push_back(1);
    return OkStatus();
  });
  const CommStream::Ticket failed = stream.Submit([&] {
    ran.push_back(2);
    return InternalError("broken");
  });
  const CommStream::Ticket skipped = stream.Submit([&] {
    ran.push_back(3);
    return OkStatus();
  });
  EXPECT_EQ(stream.Wait(failed).code(), StatusCode::kInternal);
  EXPECT_EQ(stream.Wait(skipped).code(), StatusCode::kInternal);
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
}

// Without a device, the caller stalls from the call: its compute has finished when it waits.
TEST(CommStreamTest, OnTheCpuTheCallerStallsForTheWholeWait) {
  CommStream stream("test");
  ASSERT_TRUE(stream.Wait(SubmitTaking(stream, milliseconds(300))).ok());
  EXPECT_GE(stream.blocked_seconds(), 0.25);
  EXPECT_LT(stream.blocked_seconds(), 0.5);
}

// On a device still running 200 ms of its backlog, work that takes 300 ms stalls the rank for
// the last 100 ms; work that takes 100 ms, not at all.
TEST(CommStreamTest, BehindADeviceTheCallerStallsOnlyOnceItsComputeHasFinished) {
  DeviceBehindTheHost device(milliseconds(200));
  CommStream stream("test", &device);
  ASSERT_TRUE(stream.Wait(SubmitTaking(stream, milliseconds(300))).ok());
  EXPECT_EQ(device.marks(), 1);
  EXPECT_GE(stream.blocked_seconds(), 0.06);
  EXPECT_LT(stream.blocked_seconds(), 0.2);

  stream.ResetTimes();
  ASSERT_TRUE(stream.Wait(SubmitTaking(stream, milliseconds(100))).ok());
  EXPECT_LT(stream.blocked_seconds(), 0.01);
}

// Work already done asks the device nothing: the host keeps its lead over the GPU.
TEST(CommStreamTest, AWaitForWorkAlreadyDoneMarksNothing) {
  DeviceBehindTheHost device(milliseconds(200));
  CommStream stream("test", &device);
  const CommStream::Ticket t = SubmitTaking(stream, milliseconds(0));
  ASSERT_TRUE(stream.WaitAll().ok());
  const int marks = device.marks();
  ASSERT_TRUE(stream.Wait(t).ok());
  EXPECT_EQ(device.marks(), marks);
}

}  // namespace
}  // namespace drover::engine::parallel
