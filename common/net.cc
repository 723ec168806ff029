#include "common/net.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/fd.h"

namespace drover {
namespace {

// "host:port", "[v6]:port", "[v6]", a bare IPv6 literal or a bare host, split; the port is
// "9" (discard) where none is given, since a UDP connect needs one (and sends nothing).
struct HostPort {
  std::string host;
  std::string port = "9";
};

HostPort SplitAddress(std::string_view address) {
  HostPort hp;
  if (address.starts_with('[')) {
    const size_t close = address.find(']');
    if (close == std::string_view::npos) return hp;  // no host
    hp.host = std::string(address.substr(1, close - 1));
    if (address.substr(close + 1).starts_with(':') && close + 2 < address.size()) {
      hp.port = std::string(address.substr(close + 2));
    }
    return hp;
  }
  const size_t colon = address.find(':');
  if (colon == std::string_view::npos || colon != address.rfind(':')) {
    hp.host = std::string(address);  // a bare host, or a bare IPv6 literal
    return hp;
  }
  hp.host = std::string(address.substr(0, colon));
  if (colon + 1 < address.size()) hp.port = std::string(address.substr(colon + 1));
  return hp;
}

// A socket address as text ("" when it is of no family drover speaks).
std::string AddressText(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* at = nullptr;
  if (sa->sa_family == AF_INET) at = &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr;
  if (sa->sa_family == AF_INET6) at = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
  if (at == nullptr || inet_ntop(sa->sa_family, at, text, sizeof(text)) == nullptr) return "";
  return text;
}

}  // namespace

StatusOr<std::string> ResolveHost(std::string_view host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string name(host);
  if (const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found); rc != 0) {
    return NotFoundError("cannot resolve '" + name + "': " + gai_strerror(rc));
  }
  std::string text;
  for (const addrinfo* ai = found; ai != nullptr && text.empty(); ai = ai->ai_next) {
    text = AddressText(ai->ai_addr);
  }
  freeaddrinfo(found);
  if (text.empty()) return NotFoundError("'" + name + "' resolves to no IPv4 or IPv6 address");
  return text;
}

StatusOr<std::string> LocalAddressToward(std::string_view address) {
  const auto [host, port] = SplitAddress(address);
  if (host.empty())
    return InvalidArgumentError("no host in address '" + std::string(address) + "'");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return NotFoundError("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  std::string why = "no address";
  std::string result;
  for (const addrinfo* ai = found; ai != nullptr && result.empty(); ai = ai->ai_next) {
    ScopedFd fd(socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0 || connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      why = std::strerror(errno);
      continue;
    }
    result = AddressText(reinterpret_cast<const sockaddr*>(&local));
  }
  freeaddrinfo(found);
  if (result.empty()) {
    return UnavailableError("no route to '" + host + "' to pick a local address by: " + why);
  }
  return result;
}

}  // namespace drover
