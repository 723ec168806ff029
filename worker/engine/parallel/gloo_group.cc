#include "worker/engine/parallel/gloo_group.h"

#include <gloo/common/logging.h>
#include <gloo/context.h>

#include <algorithm>
#include <cctype>
#include <utility>

namespace drover::engine::parallel {
namespace {

bool Contains(const std::string& haystack, std::string_view needle) {
  auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower(a) == std::tolower(b); });
  return it != haystack.end();
}

// Gloo has one exception type for every I/O failure; the message is all that tells a peer
// that hangs from one that died. The phrases are those of Gloo's tcp transport: "Timed out
// waiting", "Connect timeout", "Read timeout", and "Application timeout caused pair
// closure" (another wait of this rank timed out and Gloo closed every pair); "Connection
// closed by peer", "Socket closed", errno text such as "Connection reset by peer" or
// "Broken pipe".
StatusCode ClassifyGlooMessage(const std::string& message) {
  if (Contains(message, "timed out") || Contains(message, "timeout")) {
    return StatusCode::kDeadlineExceeded;
  }
  // No bare "eof": it is in "sizeof", which Gloo's assertions print.
  for (std::string_view closed :
       {"closed", "reset by peer", "broken pipe", "connection refused", "not connected"}) {
    if (Contains(message, closed)) return StatusCode::kUnavailable;
  }
  return StatusCode::kInternal;
}

}  // namespace

Status GlooExceptionToStatus(std::exception_ptr error, const std::string& where) {
  std::string message;
  try {
    std::rethrow_exception(std::move(error));
  } catch (const KvStoreError& e) {
    return e.status().WithContext(where);
  } catch (const gloo::EnforceNotMet& e) {
    // A Gloo assertion: a caller bug or a Gloo bug, except where it reports the state of a
    // pair that closed under it.
    message = e.what();
  } catch (const std::exception& e) {
    // gloo::IoException and the rest of gloo::Exception derive from std::exception.
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  return Status(ClassifyGlooMessage(message), where + ": " + message);
}

GlooGroup::GlooGroup(std::string name, int rank, int size, std::chrono::milliseconds timeout,
                     std::shared_ptr<gloo::Context> context)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      context_(std::move(context)) {}

GlooGroup::~GlooGroup() = default;

Status GlooGroup::Break(const GlooOp& op, std::exception_ptr error) {
  error_ = GlooExceptionToStatus(std::move(error), DescribeGlooOp(name_, rank_, size_, op));
  if (context_ != nullptr) {
    try {
      context_->closeConnections();
    } catch (...) {
      // Closing is best effort: the group is broken either way.
    }
  }
  return error_;
}

std::chrono::milliseconds GlooGroup::Remaining(GlooClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - GlooClock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

std::string DescribeGlooOp(const std::string& group, int rank, int size, const GlooOp& op) {
  std::string text = "gloo group \"" + group + "\" (rank " + std::to_string(rank) + " of " +
                     std::to_string(size) + ") " + op.name;
  if (op.peer >= 0) text += " with peer " + std::to_string(op.peer);
  return text;
}

}  // namespace drover::engine::parallel
