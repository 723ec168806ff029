#include "coordinator/rendezvous_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace drover::coordinator {
namespace {

v1::KvKey Key(const std::string& key, int64_t attempt = 1) {
  v1::KvKey k;
  k.set_job_id("local-1");
  k.set_attempt(attempt);
  k.set_key(key);
  return k;
}

class RendezvousServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_.OpenAttempt("local-1", 1);
    auto server = RendezvousServer::Start(&store_, "127.0.0.1");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::RendezvousService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  RendezvousStore store_;
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
};

TEST_F(RendezvousServerTest, ServesTheStoreOnAnEphemeralLoopbackPort) {
  EXPECT_EQ(server_->address().rfind("127.0.0.1:", 0), 0u);
  EXPECT_NE(server_->address(), "127.0.0.1:0");
  {
    grpc::ClientContext ctx;
    v1::KvSetRequest req;
    *req.mutable_key() = Key("addr/0");
    req.set_value("host:1234");
    v1::KvSetResponse resp;
    ASSERT_TRUE(stub_->Set(&ctx, req, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::KvGetRequest req;
    *req.mutable_key() = Key("addr/0");
    v1::KvGetResponse resp;
    ASSERT_TRUE(stub_->Get(&ctx, req, &resp).ok());
    EXPECT_TRUE(resp.found());
    EXPECT_EQ(resp.value(), "host:1234");
  }
  {
    grpc::ClientContext ctx;
    v1::KvAddRequest req;
    *req.mutable_key() = Key("joined");
    req.set_delta(2);
    v1::KvAddResponse resp;
    ASSERT_TRUE(stub_->Add(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.value(), 2);
  }
  {
    grpc::ClientContext ctx;
    v1::KvGetRequest req;
    *req.mutable_key() = Key("addr/0", 2);  // an attempt that is not open
    v1::KvGetResponse resp;
    EXPECT_EQ(stub_->Get(&ctx, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
}

TEST_F(RendezvousServerTest, ClosingTheAttemptReleasesAWaitSoShutdownIsPrompt) {
  grpc::Status waited;
  std::thread waiter([&] {
    grpc::ClientContext ctx;
    v1::KvWaitRequest req;
    req.set_job_id("local-1");
    req.set_attempt(1);
    req.add_keys("never");
    req.set_timeout_ms(60000);
    v1::KvWaitResponse resp;
    waited = stub_->Wait(&ctx, req, &resp);
  });
  // Whether the Wait is already blocked or arrives later, closing the attempt ends it.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  store_.CloseAttempt("local-1", 1);
  waiter.join();
  server_->Shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace drover::coordinator
