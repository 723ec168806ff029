// LineForwarder: copies what child processes print to this process's stdout and stderr,
// each line prefixed with its source ("[rank 3] "), for launchers that run several
// trainers in one terminal (`drover train --nproc N`).
//
// Whole lines only: one thread polls every source and writes each batch of complete,
// prefixed lines with one WriteAll, so lines of different sources never mix within a line
// (a shared destination sees them in the order they were read). A line still open at EOF
// (no final newline) is written with a newline added. A line longer than kMaxLineBytes is
// cut there, so a child printing without newlines cannot grow the buffer without bound.
//
// Thread-safety: construct, Finish and destroy from one thread. Write errors on a
// destination (a closed terminal, EPIPE) drop that output and never stop the reading: a
// child blocked on a full pipe would stall.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace drover {

class LineForwarder {
 public:
  static constexpr size_t kMaxLineBytes = 64 * 1024;

  struct Source {
    int fd = -1;       // read end (e.g. of a pipe); owned and closed by the forwarder
    int dest_fd = -1;  // where the lines go (STDOUT_FILENO...); not owned
    std::string prefix;
  };

  // Starts the forwarding thread.
  explicit LineForwarder(std::vector<Source> sources);
  ~LineForwarder();  // Finish(0)

  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;

  // Waits until every source reached EOF or `timeout_ms` passed, then forwards whatever is
  // still readable, ends every open line and stops. True when every source reached EOF (a
  // false one: something, e.g. a grandchild, still holds a pipe open). Idempotent.
  bool Finish(int64_t timeout_ms);

 private:
  struct Stream {
    Source source;
    std::string pending;  // the line read so far, without its newline
    bool eof = false;
  };

  void Run();
  // One read from `s`, forwarding the lines it completes. False when nothing more will
  // come from this call's point of view: EOF or an error (the stream is then ended), or
  // nothing to read on a non-blocking descriptor.
  bool Pump(Stream* s);
  // Forwards the open line, if any, and closes the source.
  void EndStream(Stream* s);

  std::vector<Stream> streams_;  // touched only by the forwarding thread until it is joined
  std::atomic<bool> stop_{false};
  Mutex mu_;
  CondVar all_eof_cv_;
  bool all_eof_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace drover
