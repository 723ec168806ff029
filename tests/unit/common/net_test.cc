#include "common/net.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/tls.h"

namespace drover {
namespace {

// Whether this machine can route to ::1 (IPv6 may be off in a container).
bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 to{};
  to.sin6_family = AF_INET6;
  to.sin6_addr = in6addr_loopback;
  to.sin6_port = htons(9);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0;
  close(fd);
  return ok;
}

TEST(NetTest, ALoopbackCoordinatorIsReachedFromLoopback) {
  StatusOr<std::string> local = LocalAddressToward("127.0.0.1:7600");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
  // A name, and no port.
  local = LocalAddressToward("localhost");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(IsLoopbackHost(*local)) << *local;
}

TEST(NetTest, Ipv6AddressesWithAndWithoutBrackets) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  for (const char* address : {"[::1]:7600", "::1", "[::1]"}) {
    StatusOr<std::string> local = LocalAddressToward(address);
    ASSERT_TRUE(local.ok()) << address << ": " << local.status();
    EXPECT_EQ(*local, "::1") << address;
  }
}

TEST(NetTest, ResolveHostGivesTheFirstAddressAsText) {
  StatusOr<std::string> a = ResolveHost("127.0.0.1");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, "127.0.0.1");
  a = ResolveHost("localhost");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(IsLoopbackHost(*a)) << *a;
  // A name that cannot be an address: refused by the resolver without asking DNS.
  EXPECT_EQ(ResolveHost("bad host name").status().code(), StatusCode::kNotFound);
}

TEST(NetTest, AnAddressWithoutAHostIsRefused) {
  StatusOr<std::string> local = LocalAddressToward(":7600");
  EXPECT_EQ(local.status().code(), StatusCode::kInvalidArgument) << local.status();
  EXPECT_NE(local.status().message().find("no host"), std::string::npos) << local.status();
}

}  // namespace
}  // namespace drover
