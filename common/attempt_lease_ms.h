// The timing of a trainer's lease on its attempt (worker/attempt_lease.h), shared by the two
// sides of it: the agent, which gives its trainers the lease's validity, and the coordinator,
// whose rendezvous store confirms leases (coordinator/rendezvous.h) and lets a new attempt's
// leases start only once every lease of the attempts before it has lapsed.
#pragma once

#include <algorithm>
#include <cstdint>

namespace drover {

// How long a confirmed lease stays current: two thirds of the coordinator's node timeout,
// so that a trainer cut off from the coordinator stops publishing before its node can be
// declared dead and another attempt started.
inline int64_t AttemptLeaseMs(int64_t node_timeout_ms) {
  return std::max<int64_t>(300, 2 * node_timeout_ms / 3);
}

}  // namespace drover
