#include "worker/engine/parallel/peer_check.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include "common/fd.h"

namespace drover::engine::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// Connections probed at once: bounds the descriptors a rank of a large job holds.
constexpr size_t kBatch = 256;

Status Errno(const std::string& what) {
  return UnavailableError(what + ": " + std::strerror(errno));
}

std::string Text(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* at =
      sa->sa_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr);
  if (inet_ntop(sa->sa_family, at, text, sizeof(text)) == nullptr) return "";
  return text;
}

// "host:port" -> (host, port); "[v6]:port" too.
std::pair<std::string, std::string> Split(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return {host, colon == std::string::npos ? "" : address.substr(colon + 1)};
}

// A listening socket on the bind address that accepts and closes every connection, on a
// thread of its own, until destroyed.
class Listener {
 public:
  static StatusOr<std::unique_ptr<Listener>> Open(const std::string& bind_address) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int rc = getaddrinfo(bind_address.c_str(), "0", &hints, &found); rc != 0) {
      return UnavailableError("peer check: cannot resolve the bind address '" + bind_address +
                              "': " + gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, freeaddrinfo);
    ScopedFd fd(socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return Errno("peer check: socket");
    if (bind(fd.get(), found->ai_addr, found->ai_addrlen) != 0) {
      return Errno("peer check: bind to " + bind_address);
    }
    if (listen(fd.get(), SOMAXCONN) != 0) return Errno("peer check: listen");
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) {
      return Errno("peer check: getsockname");
    }
    const sockaddr* sa = reinterpret_cast<const sockaddr*>(&local);
    const int port =
        ntohs(sa->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
    const std::string host = Text(sa);
    const std::string address =
        (sa->sa_family == AF_INET6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return Errno("peer check: pipe");
    const int listening = fd.get();
    fd.Forget();
    return std::unique_ptr<Listener>(new Listener(listening, pipe_fds, address));
  }

  ~Listener() {
    (void)!write(stop_write_, "x", 1);
    thread_.join();
    close(stop_write_);
    close(stop_read_);
    close(fd_);
  }

  const std::string& address() const { return address_; }

 private:
  Listener(int fd, const int (&pipe_fds)[2], std::string address)
      : fd_(fd), stop_read_(pipe_fds[0]), stop_write_(pipe_fds[1]), address_(std::move(address)) {
    thread_ = std::thread([this] { Loop(); });
  }

  void Loop() {
    while (true) {
      pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_read_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) != 0) {
        const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c >= 0) close(c);
      }
    }
  }

  const int fd_, stop_read_, stop_write_;
  const std::string address_;
  std::thread thread_;
};

// Whether each of `addresses` accepts a TCP connection within `timeout`, all of them tried
// at once.
std::vector<bool> Probe(const std::vector<std::string>& addresses,
                        std::chrono::milliseconds timeout) {
  std::vector<bool> reached(addresses.size(), false);
  std::vector<int> sockets;  // closed at the end
  std::vector<pollfd> pending;
  std::vector<size_t> which;
  for (size_t i = 0; i < addresses.size(); ++i) {
    const auto [host, port] = Split(addresses[i]);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo* found = nullptr;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) continue;
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(found, freeaddrinfo);
    const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockets.push_back(fd);
    if (connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
      reached[i] = true;
    } else if (errno == EINPROGRESS) {
      pending.push_back({fd, POLLOUT, 0});
      which.push_back(i);
    }
    // Any other error (no route, a blackhole, refused at once): unreachable.
  }
  const auto deadline = Clock::now() + timeout;
  while (!pending.empty()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    const int n = poll(pending.data(), pending.size(), static_cast<int>(left));
    if (n < 0 && errno != EINTR) break;
    for (size_t k = pending.size(); k-- > 0;) {
      if (pending[k].revents == 0) continue;
      int error = 0;
      socklen_t len = sizeof(error);
      if (getsockopt(pending[k].fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0) {
        reached[which[k]] = true;
      }
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
      which.erase(which.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (int fd : sockets) close(fd);
  return reached;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string list;
  for (int r : ranks) {
    // Appended piecewise: GCC 12 reads `"," + std::to_string(r)` as an overlapping memcpy
    // (a false -Wrestrict).
    if (!list.empty()) list += ',';
    list += std::to_string(r);
  }
  return list.empty() ? "none" : list;
}

StatusOr<std::vector<int>> ParseRankList(const std::string& text, int size) {
  std::vector<int> ranks;
  if (text == "none") return ranks;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    const long r = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || r < 0 || r >= size) {
      return InvalidArgumentError("peer check: malformed findings '" + text + "'");
    }
    ranks.push_back(static_cast<int>(r));
    at = comma + 1;
  }
  return ranks;
}

}  // namespace

StatusOr<PeerCheckResult> CheckPeers(KvStore* store, int rank, int size,
                                     const PeerCheckOptions& options) {
  PeerCheckResult result;
  result.unreachable.resize(static_cast<size_t>(size));
  result.addresses.resize(static_cast<size_t>(size));
  ASSIGN_OR_RETURN(std::unique_ptr<Listener> listener, Listener::Open(options.bind_address));
  RETURN_IF_ERROR(store->Set("peers/addr/" + std::to_string(rank), listener->address()));
  for (int r = 0; r < size; ++r) {
    ASSIGN_OR_RETURN(result.addresses[r],
                     store->Get("peers/addr/" + std::to_string(r), options.arrival_timeout));
  }
  // Every peer, kBatch at a time.
  std::vector<int> mine;
  for (int first = 0; first < size; first += static_cast<int>(kBatch)) {
    std::vector<int> peers;
    std::vector<std::string> addresses;
    for (int r = first; r < std::min(size, first + static_cast<int>(kBatch)); ++r) {
      if (r == rank) continue;
      peers.push_back(r);
      addresses.push_back(result.addresses[r]);
    }
    const std::vector<bool> reached = Probe(addresses, options.probe_timeout);
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!reached[i]) mine.push_back(peers[i]);
    }
  }
  RETURN_IF_ERROR(store->Set("peers/result/" + std::to_string(rank), RankList(mine)));
  // The listener stays up until every rank has published its findings: a slower peer may
  // still be connecting to it.
  for (int r = 0; r < size; ++r) {
    ASSIGN_OR_RETURN(const std::string text,
                     store->Get("peers/result/" + std::to_string(r), options.arrival_timeout));
    ASSIGN_OR_RETURN(result.unreachable[r], ParseRankList(text, size));
  }
  return result;
}

std::vector<int> CutOffRanks(const Reachability& unreachable) {
  const int size = static_cast<int>(unreachable.size());
  std::set<std::pair<int, int>> failed;  // (lower rank, higher rank)
  for (int a = 0; a < size; ++a) {
    for (int b : unreachable[a]) failed.insert({std::min(a, b), std::max(a, b)});
  }
  std::vector<int> blamed;
  while (!failed.empty()) {
    std::vector<int> count(static_cast<size_t>(size), 0);
    for (const auto& [a, b] : failed) {
      ++count[a];
      ++count[b];
    }
    const int worst =
        static_cast<int>(std::max_element(count.begin(), count.end()) - count.begin());
    blamed.push_back(worst);
    std::erase_if(
        failed, [worst](const auto& pair) { return pair.first == worst || pair.second == worst; });
  }
  std::sort(blamed.begin(), blamed.end());
  return blamed;
}

std::string DescribeReachability(const PeerCheckResult& result) {
  std::string text;
  for (size_t r = 0; r < result.unreachable.size(); ++r) {
    const std::vector<int>& lost = result.unreachable[r];
    if (lost.empty()) continue;
    if (!text.empty()) text += "; ";
    text += "rank " + std::to_string(r) + " (" + result.addresses[r] + ") could not reach rank" +
            (lost.size() > 1 ? "s " : " ") + RankList(lost);
  }
  return text;
}

}  // namespace drover::engine::parallel
