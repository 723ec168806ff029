// Job ids: short, sortable by submission, readable ("j-000042-3fa2").
#pragma once

#include <cstdint>
#include <string>

namespace drover::coordinator {

// `seq` is the job's submission sequence number; `salt` makes ids of two coordinators
// (or a coordinator whose state dir was wiped) unlikely to collide.
std::string MakeJobId(int64_t seq, uint32_t salt);

}  // namespace drover::coordinator
