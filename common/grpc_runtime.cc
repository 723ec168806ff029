#include "common/grpc_runtime.h"

#include <absl/synchronization/mutex.h>

#include <mutex>

namespace drover {

void TuneGrpcRuntime() {
  static std::once_flag once;
  std::call_once(once, [] { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); });
}

}  // namespace drover
