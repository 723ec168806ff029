// The one rule for the CLI's exit codes (cli/command.h): 0 success, 1 a runtime failure,
// 2 input the user must fix. Header-only, so that its unit test includes it directly.
#pragma once

#include "cli/command.h"
#include "common/status.h"

namespace drover::cli {

// The exit code for a failure to use a file or directory the user named (a spec, a model,
// token shards, a tokenizer's files): 2 when it is missing, not readable, or not what it
// should be (NotFound, InvalidArgument, FailedPrecondition, OutOfRange, and DataLoss: a
// corrupt or foreign file); 1 when the machine failed (no memory or disk left, an I/O
// error, a bug), which a retry could get past.
inline int ExitCodeForInput(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kNotFound:
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
    case StatusCode::kDataLoss:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

}  // namespace drover::cli
