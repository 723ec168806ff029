#include "worker/grpc_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/fd.h"
#include "worker/rendezvous_client.h"

namespace drover {
namespace {

// A rendezvous service that takes every Set.
class AcceptingRendezvous final : public v1::RendezvousService::Service {
  grpc::Status Set(grpc::ServerContext*, const v1::KvSetRequest*, v1::KvSetResponse*) override {
    return grpc::Status::OK;
  }
};

// The kernel's count of SYNs dropped for a full accept queue (TcpExt ListenOverflows in
// /proc/net/netstat), for this network namespace; -1 where it cannot be read.
int64_t ListenOverflows() {
  std::ifstream in("/proc/net/netstat");
  std::string names, values;
  while (std::getline(in, names) && std::getline(in, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    while (n >> name && v >> value) {
      if (name == "ListenOverflows") return std::stoll(value);
    }
  }
  return -1;
}

// A listening socket whose accept queue (backlog 0: room for one) is held full by a
// connection nobody accepts, so that the kernel drops the next SYN, as a network drops a
// packet; the client's TCP sends it again after its initial retransmission timeout (1 s).
// Once the kernel has counted that drop (or after 5 s), a thread accepts the filler and
// closes it, then hands the next connection to `server`.
class DroppingListener {
 public:
  explicit DroppingListener(grpc::Server* server) {
    listener_.reset(socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(listener_.get(), 0), 0);
    EXPECT_EQ(getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    filler_.reset(socket(AF_INET, SOCK_STREAM, 0));
    EXPECT_EQ(connect(filler_.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
    const int64_t before = ListenOverflows();
    thread_ = std::thread([this, server, before] {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (ListenOverflows() <= before && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      dropped_ = ListenOverflows() > before;
      const int filler = accept(listener_.get(), nullptr, nullptr);
      if (filler >= 0) close(filler);
      const int fd = accept(listener_.get(), nullptr, nullptr);
      if (fd < 0) return;
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      grpc::AddInsecureChannelFromFd(server, fd);  // the server owns it now
    });
  }
  ~DroppingListener() {
    shutdown(listener_.get(), SHUT_RDWR);  // ends a thread still waiting in accept
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Whether the kernel counted a dropped SYN before the listener made room.
  bool dropped() const { return dropped_; }

 private:
  ScopedFd listener_{-1}, filler_{-1};
  int port_ = 0;
  std::atomic<bool> dropped_{false};
  std::thread thread_;
};

// A lost SYN costs a call the second TCP takes to send it again, not the call: a channel
// that gave each connection attempt 100 ms (gRPC reads GRPC_ARG_MIN_RECONNECT_BACKOFF_MS as
// that) failed it with "tcp handshaker shutdown", and a trainer's start-up with it.
TEST(GrpcUtilTest, ACallOutlastsALostSyn) {
  AcceptingRendezvous service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  {
    DroppingListener listener(server.get());
    RendezvousClient client(listener.address(), "j-1", 1, /*rpc_timeout_ms=*/5000);
    const auto start = std::chrono::steady_clock::now();
    const Status st = client.Set("key", "value");
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(st.ok()) << st;
    // The SYN was dropped and sent again, or this test tested nothing.
    EXPECT_TRUE(listener.dropped());
    EXPECT_GT(took, std::chrono::milliseconds(500));
  }
  server->Shutdown();
}

}  // namespace
}  // namespace drover
