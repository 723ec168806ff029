// The version of drover's wire protocol that an agent states when it registers
// (RegisterRequest.protocol_version), so that a coordinator refuses an agent whose trainers
// it would misunderstand instead of running them:
//   1: trainers confirm their lease on an attempt by a rendezvous Set of "lease/<rank>";
//   2: by RendezvousService.ConfirmLease (a version-1 trainer's Set is a plain key to a
//      version-2 coordinator, which would never hold it to the lease's fence).
#pragma once

#include <cstdint>

namespace drover {

inline constexpr int32_t kProtocolVersion = 2;

}  // namespace drover
