// Process-wide settings of the gRPC runtime, applied once by every drover process that
// uses gRPC (the coordinator's server, every channel from the agent, trainers and CLI).
#pragma once

namespace drover {

// Idempotent and thread-safe. Today: turns off absl::Mutex's deadlock detector, which
// Debian's Abseil (built without NDEBUG) leaves on. With it on, every lock and every
// mutex gRPC creates or destroys goes through a global lock-order graph; with thousands of
// connections that graph cost more CPU than the RPCs (44% of a simulated agent fleet's
// CPU, tests/bench/heartbeat_bench.cc). drover's own locks are drover::Mutex (common/mutex.h).
void TuneGrpcRuntime();

}  // namespace drover
