// The version of drover's wire protocol that an agent states when it registers
// (RegisterRequest.protocol_version), so that a coordinator refuses an agent whose trainers
// it would misunderstand instead of running them:
//   1: trainers confirm their lease on an attempt by a rendezvous Set of "lease/<rank>";
//   2: by RendezvousService.ConfirmLease (a version-1 trainer's Set is a plain key to a
//      version-2 coordinator, which would never hold it to the lease's fence);
//   3: a step's all-reduce carries four values, not three (the vote that defers a
//      checkpoint), and checkpoint manifests are sealed (format 3, which version-2 trainers
//      refuse): ranks of two releases in one job would disagree on both.
#pragma once

#include <cstdint>

namespace drover {

inline constexpr int32_t kProtocolVersion = 3;

}  // namespace drover
