// Status / StatusOr: errors are values.
//
// Expected failures (bad input, missing files, dead peers, timeouts) are returned as a
// Status; broken invariants use DROVER_CHECK, which aborts with file:line. Foreign error
// codes (errno, SQLite, grpc::Status, CUDA, NCCL) are translated at the boundary, one
// helper each, never passed around raw.
#pragma once

#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace drover {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy with `context + ": "` prepended to the message (same code).
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) {
  return {StatusCode::kAlreadyExists, std::move(m)};
}
inline Status PermissionDeniedError(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status UnauthenticatedError(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}
inline Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status AbortedError(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status OutOfRangeError(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status UnimplementedError(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}

// Translates an errno value at the boundary: "<context>: <strerror>" with a matching code.
Status ErrnoToStatus(int err, std::string_view context);

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, std::string_view msg);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : value_(status) {  // NOLINT: implicit by design
    if (status.ok()) CheckFailed(__FILE__, __LINE__, "!status.ok()", "StatusOr built from OK");
  }
  StatusOr(Status&& status) : value_(std::move(status)) {  // NOLINT
    if (std::get<Status>(value_).ok())
      CheckFailed(__FILE__, __LINE__, "!status.ok()", "StatusOr built from OK");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? Status() : std::get<Status>(value_); }

  const T& value() const& {
    Check();
    return std::get<T>(value_);
  }
  T& value() & {
    Check();
    return std::get<T>(value_);
  }
  T&& value() && {
    Check();
    return std::get<T>(std::move(value_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void Check() const {
    if (!ok()) CheckFailed(__FILE__, __LINE__, "ok()", std::get<Status>(value_).ToString());
  }
  std::variant<Status, T> value_;
};

}  // namespace drover

#define DROVER_CONCAT_INNER(a, b) a##b
#define DROVER_CONCAT(a, b) DROVER_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::drover::Status _drover_st = (expr);    \
    if (!_drover_st.ok()) return _drover_st; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(DROVER_CONCAT(_drover_sor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

// Aborts with file:line when an invariant is broken. Not for expected failures.
#define DROVER_CHECK(cond)                                             \
  do {                                                                 \
    if (!(cond)) ::drover::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define DROVER_CHECK_MSG(cond, msg)                                       \
  do {                                                                    \
    if (!(cond)) ::drover::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
#define DROVER_CHECK_OK(expr)                                                                      \
  do {                                                                                             \
    ::drover::Status _drover_st = (expr);                                                          \
    if (!_drover_st.ok()) ::drover::CheckFailed(__FILE__, __LINE__, #expr, _drover_st.ToString()); \
  } while (0)
