#include "worker/line_forwarder.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "common/fd.h"

namespace drover {
namespace {

// How often the poll looks up from the pipes to see whether Finish gave up waiting.
constexpr int kPollMs = 50;

void AppendLine(const std::string& prefix, std::string_view text, std::string* out) {
  out->append(prefix);
  out->append(text);
  out->push_back('\n');
}

void Forward(int dest_fd, const std::string& text) {
  if (!text.empty()) (void)WriteAll(dest_fd, text, "forwarded output");
}

}  // namespace

LineForwarder::LineForwarder(std::vector<Source> sources) {
  streams_.reserve(sources.size());
  for (Source& s : sources) streams_.push_back(Stream{std::move(s), "", false});
  thread_ = std::thread([this] { Run(); });
}

LineForwarder::~LineForwarder() { Finish(0); }

bool LineForwarder::Finish(int64_t timeout_ms) {
  if (!thread_.joinable()) {
    MutexLock lock(&mu_);
    return all_eof_;
  }
  bool all_eof = false;
  {
    MutexLock lock(&mu_);
    all_eof = all_eof_cv_.WaitFor(&mu_, std::chrono::milliseconds(timeout_ms),
                                  [this]() REQUIRES(mu_) { return all_eof_; });
  }
  stop_ = true;
  thread_.join();
  return all_eof;
}

void LineForwarder::Run() {
  std::vector<pollfd> fds;
  std::vector<Stream*> open;
  while (!stop_) {
    fds.clear();
    open.clear();
    for (Stream& s : streams_) {
      if (s.eof) continue;
      fds.push_back(pollfd{s.source.fd, POLLIN, 0});
      open.push_back(&s);
    }
    if (open.empty()) {
      MutexLock lock(&mu_);
      all_eof_ = true;
      all_eof_cv_.SignalAll();
      return;
    }
    if (poll(fds.data(), fds.size(), kPollMs) <= 0) continue;  // timeout or EINTR
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Pump(open[i]);
    }
  }
  // Finish gave up waiting: take what the pipes hold now, without waiting for more.
  for (Stream& s : streams_) {
    if (s.eof) continue;
    fcntl(s.source.fd, F_SETFL, fcntl(s.source.fd, F_GETFL) | O_NONBLOCK);
    while (Pump(&s)) {
    }
    if (!s.eof) EndStream(&s);
  }
}

bool LineForwarder::Pump(Stream* s) {
  char buf[64 * 1024];
  const ssize_t n = read(s->source.fd, buf, sizeof(buf));
  if (n < 0 && errno == EINTR) return true;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (n <= 0) {
    EndStream(s);
    return false;
  }
  s->pending.append(buf, static_cast<size_t>(n));
  std::string out;
  std::string_view rest(s->pending);
  for (;;) {
    const size_t nl = rest.find('\n');
    if (nl != std::string_view::npos) {
      AppendLine(s->source.prefix, rest.substr(0, nl), &out);
      rest.remove_prefix(nl + 1);
    } else if (rest.size() >= kMaxLineBytes) {
      AppendLine(s->source.prefix, rest.substr(0, kMaxLineBytes), &out);
      rest.remove_prefix(kMaxLineBytes);
    } else {
      break;
    }
  }
  s->pending.erase(0, s->pending.size() - rest.size());
  Forward(s->source.dest_fd, out);
  return true;
}

void LineForwarder::EndStream(Stream* s) {
  if (!s->pending.empty()) {
    std::string out;
    AppendLine(s->source.prefix, s->pending, &out);
    Forward(s->source.dest_fd, out);
    s->pending.clear();
  }
  close(s->source.fd);
  s->eof = true;
}

}  // namespace drover
