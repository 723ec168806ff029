#include "worker/attempt_lease.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "proto/drover.grpc.pb.h"

namespace drover {
namespace {

// Runs `service` on a loopback port; address() is where to dial it.
class Server {
 public:
  explicit Server(grpc::Service* service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~Server() { server_->Shutdown(); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// What the lease's stop callback was given, once it is called.
class Stopped {
 public:
  std::function<void(const Status&)> Callback() {
    return [this](const Status& st) {
      MutexLock lock(&mu_);
      status_ = st;
      ++calls_;
      cv_.SignalAll();
    };
  }
  // The status of the first call, or Cancelled when none came within `timeout`.
  Status Wait(std::chrono::milliseconds timeout) {
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, timeout, [this]() REQUIRES(mu_) { return calls_ > 0; });
    return calls_ > 0 ? status_ : CancelledError("the lease never stopped");
  }
  int calls() {
    MutexLock lock(&mu_);
    return calls_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  Status status_ GUARDED_BY(mu_);
  int calls_ GUARDED_BY(mu_) = 0;
};

// A rendezvous service that confirms leases (of any attempt) until `superseded`, then
// answers as the coordinator does for an attempt it no longer serves.
class Confirming final : public v1::RendezvousService::Service {
 public:
  grpc::Status ConfirmLease(grpc::ServerContext*, const v1::LeaseRequest*,
                            v1::LeaseResponse*) override {
    if (superseded.load()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "attempt 1 is not the running one");
    }
    return grpc::Status::OK;
  }
  std::atomic<bool> superseded{false};
};

// The lease is current while its attempt is served; once superseded, the next confirmation
// stops the trainer, once.
TEST(AttemptLeaseTest, IsCurrentWhileItsAttemptIsServedAndStopsTheTrainerOnceSuperseded) {
  Confirming service;
  Server server(&service);
  RendezvousClient client(server.address(), "j", 1, /*rpc_timeout_ms=*/2000);
  Stopped stopped;
  AttemptLease lease(&client, /*validity_ms=*/400, stopped.Callback());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!lease.Current() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(lease.Current());
  service.superseded = true;
  const Status st = stopped.Wait(std::chrono::seconds(5));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_FALSE(lease.Current());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // confirmations would go on
  EXPECT_EQ(stopped.calls(), 1);
}

// A coordinator of an earlier release serves no ConfirmLease (the generated service answers
// UNIMPLEMENTED): the lease would never be current and nothing be published, so the
// trainer is stopped, saying why, rather than left training for nothing.
TEST(AttemptLeaseTest, ACoordinatorThatServesNoLeasesStopsTheTrainer) {
  v1::RendezvousService::Service earlier_release;
  Server server(&earlier_release);
  RendezvousClient client(server.address(), "j", 1, /*rpc_timeout_ms=*/2000);
  Stopped stopped;
  AttemptLease lease(&client, /*validity_ms=*/400, stopped.Callback());
  const Status st = stopped.Wait(std::chrono::seconds(5));
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st;
  EXPECT_FALSE(lease.Current());
}

}  // namespace
}  // namespace drover
