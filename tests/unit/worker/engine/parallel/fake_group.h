// A Communicator for tests that replace a group with a stand-in: rank 0 of `size`, a name,
// no waits, and every call Unimplemented (naming it) until a test's subclass gives it a
// meaning; Barrier and Sync are OK.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "worker/engine/parallel/communicator.h"

namespace drover::engine::testing {

using parallel::Communicator;
using parallel::DataType;
using parallel::ReduceOp;
using parallel::Request;

class FakeGroup : public Communicator {
 public:
  FakeGroup(std::string name, int size) : name_(std::move(name)), size_(size) {}

  int rank() const override { return 0; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }
  double wait_seconds() const override { return 0; }

  Status AllReduce(void*, size_t, DataType, ReduceOp) override { return None("AllReduce"); }
  Status ReduceScatter(void*, std::span<const size_t>, DataType, ReduceOp) override {
    return None("ReduceScatter");
  }
  Status AllGather(void*, std::span<const size_t>, DataType) override { return None("AllGather"); }
  Status Broadcast(void*, size_t, DataType, int) override { return None("Broadcast"); }
  StatusOr<std::unique_ptr<Request>> Isend(const void*, size_t, int, uint64_t) override {
    return None("Isend");
  }
  StatusOr<std::unique_ptr<Request>> Irecv(void*, size_t, int, uint64_t) override {
    return None("Irecv");
  }
  Status Barrier() override { return OkStatus(); }

 private:
  Status None(const char* call) const {
    return UnimplementedError(std::string(call) + " on the fake group " + name_);
  }

  const std::string name_;
  const int size_;
};

}  // namespace drover::engine::testing
