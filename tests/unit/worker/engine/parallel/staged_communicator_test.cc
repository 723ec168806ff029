#include "worker/engine/parallel/staged_communicator.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/unit/worker/engine/emulated_device_ops.h"

namespace drover::engine::parallel {
namespace {

// A group of one whose "collectives" double every float and whose receives fill 7s, on
// device memory only, as NCCL's would be: a host pointer fails the test.
class DeviceOnlyCommunicator final : public Communicator {
 public:
  explicit DeviceOnlyCommunicator(Ops* ops) : ops_(ops) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }
  // A quarter second per collective, as if each had waited for a peer.
  double wait_seconds() const override { return 0.25 * static_cast<double>(seen.size()); }

  Status AllReduce(void* data, size_t count, DataType type, ReduceOp) override {
    return Double(data, count * SizeOf(type));
  }
  Status ReduceScatter(void* data, std::span<const size_t> counts, DataType type,
                       ReduceOp) override {
    return Double(data, counts[0] * SizeOf(type));
  }
  Status AllGather(void* data, std::span<const size_t> counts, DataType type) override {
    return Double(data, counts[0] * SizeOf(type));
  }
  Status Broadcast(void* data, size_t count, DataType type, int) override {
    return Double(data, count * SizeOf(type));
  }
  StatusOr<std::unique_ptr<Request>> Isend(const void* data, size_t, int, uint64_t) override {
    if (!ops_->IsDeviceMemory(data)) return InternalError("Isend of host memory");
    return std::unique_ptr<Request>(new Done);
  }
  StatusOr<std::unique_ptr<Request>> Irecv(void* data, size_t bytes, int, uint64_t) override {
    if (!ops_->IsDeviceMemory(data)) return InternalError("Irecv into host memory");
    ops_->Fill(static_cast<float*>(data), 7.f, bytes / sizeof(float));
    return std::unique_ptr<Request>(new Done);
  }
  Status Barrier() override {
    marks.push_back(mark_);
    mark_ = nullptr;
    return OkStatus();
  }
  // Marks are the group's own: a ComputeMark of nothing.
  std::shared_ptr<const ComputeMark> MarkCompute() override {
    return std::make_shared<ComputeMark>();
  }
  void FollowMark(std::shared_ptr<const ComputeMark> mark) override { mark_ = std::move(mark); }
  // As a stream-ordered group's: its calls returned "complete" only once synced.
  Status Sync() override {
    ++syncs;
    return sync_error;
  }

  std::vector<const void*> seen;                          // every collective's buffer
  std::vector<std::shared_ptr<const ComputeMark>> marks;  // the mark each call followed
  int syncs = 0;
  Status sync_error;  // what Sync returns: a transfer that failed after its call returned

 private:
  class Done final : public Request {
   public:
    Status Wait() override { return OkStatus(); }
  };
  Status Double(void* data, size_t bytes) {
    seen.push_back(data);
    marks.push_back(mark_);
    mark_ = nullptr;
    if (!ops_->IsDeviceMemory(data)) return InternalError("a collective on host memory");
    ops_->Scale(static_cast<float*>(data), bytes / sizeof(float), 2.f);
    return OkStatus();
  }
  Ops* ops_;
  std::string name_ = "device-only";
  std::shared_ptr<const ComputeMark> mark_;
};

// A DeviceOnlyCommunicator wrapped as the trainer wraps its NCCL groups.
struct ThroughDevice {
  ThroughDevice() {
    auto owned = std::make_unique<DeviceOnlyCommunicator>(&ops);
    inner = owned.get();
    comm = StageThroughDevice(std::move(owned), &ops);
  }
  testing::EmulatedDeviceOps ops;
  DeviceOnlyCommunicator* inner = nullptr;  // owned by comm
  std::unique_ptr<Communicator> comm;
};

// The trainer's NCCL groups are wrapped so (StageThroughDevice): a mark (Communicator::
// MarkCompute) reaches the NCCL group with a device buffer, which goes to it as it is, but
// not with a host buffer, whose staged copy is made at the call, after the mark (following
// the mark, the collective could read the copy before it landed). A mark is for one call.
TEST(StagedCommunicatorTest, ThroughDeviceAMarkGoesWithADeviceBufferAndNotWithAStagedOne) {
  ThroughDevice staged;
  testing::EmulatedDeviceOps& ops = staged.ops;
  DeviceOnlyCommunicator* inner = staged.inner;
  Communicator* comm = staged.comm.get();
  Buffer device = ops.Allocate(4);
  ops.Fill(device.data(), 1.f, 4);
  std::vector<float> host = {1, 2, 3};

  std::shared_ptr<const ComputeMark> mark = comm->MarkCompute();
  ASSERT_NE(mark, nullptr);
  comm->FollowMark(mark);
  ASSERT_TRUE(comm->AllReduce(device.data(), 4, DataType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE(comm->AllReduce(device.data(), 4, DataType::kFloat32, ReduceOp::kSum).ok());
  comm->FollowMark(mark);
  ASSERT_TRUE(comm->AllReduce(host.data(), 3, DataType::kFloat32, ReduceOp::kSum).ok());
  comm->FollowMark(mark);
  ASSERT_TRUE(comm->Barrier().ok());
  ASSERT_TRUE(comm->AllReduce(device.data(), 4, DataType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_EQ(inner->marks.size(), 5u);
  EXPECT_EQ(inner->marks[0], mark);     // a device buffer: straight through, with its mark
  EXPECT_EQ(inner->marks[1], nullptr);  // the next call: at the call
  EXPECT_EQ(inner->marks[2], nullptr);  // a staged host buffer: at the call
  EXPECT_EQ(inner->marks[3], nullptr);  // a barrier has no data to order
  EXPECT_EQ(inner->marks[4], nullptr);  // nor does it leave the mark for the call after it
}

TEST(StagedCommunicatorTest, ThroughDeviceHostBuffersMakeTheRoundTripDeviceBuffersGoStraight) {
  ThroughDevice staged;
  testing::EmulatedDeviceOps& ops = staged.ops;
  DeviceOnlyCommunicator* inner = staged.inner;
  Communicator* comm = staged.comm.get();

  std::vector<float> host = {1, 2, 3};
  ASSERT_TRUE(comm->AllReduce(host.data(), 3, DataType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(host, (std::vector<float>{2, 4, 6}));
  ASSERT_EQ(inner->seen.size(), 1u);
  EXPECT_NE(inner->seen[0], host.data());

  Buffer device = ops.Allocate(4);
  const std::vector<float> start = {1, 1, 1, 1};
  ops.FromHost(device.data(), start.data(), 4);
  const std::vector<size_t> counts = {4};
  ASSERT_TRUE(comm->AllGather(device.data(), counts, DataType::kFloat32).ok());
  EXPECT_EQ(inner->seen.back(), device.data());  // not staged
  std::vector<float> back(4);
  ops.ToHost(back.data(), device.data(), 4);
  EXPECT_EQ(back, (std::vector<float>{2, 2, 2, 2}));

  std::vector<float> received = {0, 0};
  auto request = comm->Irecv(received.data(), 2 * sizeof(float), 0, 0);
  ASSERT_TRUE(request.ok()) << request.status();
  ASSERT_TRUE((*request)->Wait().ok());
  EXPECT_EQ(received, (std::vector<float>{7, 7}));
  const std::vector<float> message = {3, 4};
  EXPECT_TRUE(comm->Send(message.data(), 2 * sizeof(float), 0, 0).ok());
}

// A stream-ordered inner group (NCCL's, CommOptions::stream_ordered) returns before its
// transfer ran, and reports a failure at Sync: a staged host buffer, which the host reads at
// once, is copied back only after the inner group synced, and not at all when that fails
// (the caller's buffer keeps its values). Device buffers are left to the stream order.
TEST(StagedCommunicatorTest, ThroughDeviceAHostBufferIsCopiedBackOnlyOnceTheInnerGroupSynced) {
  ThroughDevice staged;
  testing::EmulatedDeviceOps& ops = staged.ops;
  DeviceOnlyCommunicator* inner = staged.inner;
  Communicator* comm = staged.comm.get();
  std::vector<float> host = {1, 2, 3};
  ASSERT_TRUE(comm->AllReduce(host.data(), 3, DataType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(host, (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(inner->syncs, 1);
  Buffer device = ops.Allocate(4);
  ops.Fill(device.data(), 1.f, 4);
  ASSERT_TRUE(comm->AllReduce(device.data(), 4, DataType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(inner->syncs, 1);

  inner->sync_error = DeadlineExceededError("the transfer was aborted at its deadline");
  Status st = comm->AllReduce(host.data(), 3, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st;
  EXPECT_EQ(host, (std::vector<float>{2, 4, 6}));
  std::vector<float> received = {0, 0};
  auto request = comm->Irecv(received.data(), 2 * sizeof(float), 0, 0);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ((*request)->Wait().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(received, (std::vector<float>{0, 0}));
  EXPECT_EQ(comm->Sync().code(), StatusCode::kDeadlineExceeded);
}

TEST(StagedCommunicatorTest, WaitSecondsAreTheInnerGroupsNotTheStagingCopies) {
  testing::EmulatedDeviceOps ops;
  std::unique_ptr<Communicator> comm =
      StageThroughDevice(std::make_unique<DeviceOnlyCommunicator>(&ops), &ops);
  EXPECT_EQ(comm->wait_seconds(), 0);
  std::vector<float> host = {1, 2, 3};
  ASSERT_TRUE(comm->AllReduce(host.data(), 3, DataType::kFloat32, ReduceOp::kSum).ok());
  ASSERT_TRUE(comm->Broadcast(host.data(), 3, DataType::kFloat32, 0).ok());
  EXPECT_EQ(comm->wait_seconds(), 0.5);
}

}  // namespace
}  // namespace drover::engine::parallel
