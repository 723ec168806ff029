#include "coordinator/ids.h"

#include <cstdio>

namespace drover::coordinator {

std::string MakeJobId(int64_t seq, uint32_t salt) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "j-%06lld-%04x", static_cast<long long>(seq), salt & 0xffffu);
  return buf;
}

}  // namespace drover::coordinator
