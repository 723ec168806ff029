#include "worker/trainer_env.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "common/net.h"

namespace drover {
namespace {

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

template <typename T>
Status ReadNumber(const char* name, T* out) {
  std::string v = GetEnv(name);
  if (v.empty()) return OkStatus();
  T parsed{};
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), parsed);
  if (ec != std::errc() || ptr != v.data() + v.size()) {
    return InvalidArgumentError(std::string("environment variable ") + name + "='" + v +
                                "' is not an integer");
  }
  *out = parsed;
  return OkStatus();
}

// A coordinator on loopback means a one-machine cluster: peers are on loopback too.
// Otherwise the address of the interface toward the coordinator (common/net.h: the host
// name often resolves to a loopback address no peer can dial), and the host name only when
// there is no route to pick one by.
std::string DefaultBindAddress(const std::string& coordinator) {
  const std::string host = HostOfAddress(coordinator);
  if (host.empty() || IsLoopbackHost(host)) {
    return "127.0.0.1";
  }
  if (StatusOr<std::string> local = LocalAddressToward(coordinator); local.ok()) return *local;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "127.0.0.1";
  return name;
}

}  // namespace

StatusOr<TrainerEnv> ReadTrainerEnv() {
  TrainerEnv env;
  env.coordinator = GetEnv(kEnvCoordinator);
  env.job_id = GetEnv(kEnvJobId);
  env.spec_path = GetEnv(kEnvSpecPath);
  env.resume_checkpoint = GetEnv(kEnvResume);
  RETURN_IF_ERROR(ReadNumber(kEnvAttempt, &env.attempt));
  RETURN_IF_ERROR(ReadNumber(kEnvRank, &env.rank));
  RETURN_IF_ERROR(ReadNumber(kEnvWorldSize, &env.world_size));
  RETURN_IF_ERROR(ReadNumber(kEnvLocalRank, &env.local_rank));
  RETURN_IF_ERROR(ReadNumber(kEnvSlot, &env.slot));
  RETURN_IF_ERROR(ReadNumber(kEnvStatusFd, &env.status_fd));
  RETURN_IF_ERROR(ReadNumber(kEnvThreads, &env.threads));
  int fresh = 0;
  RETURN_IF_ERROR(ReadNumber(kEnvFresh, &fresh));
  env.fresh = fresh != 0;
  RETURN_IF_ERROR(ReadNumber(kEnvLeaseMs, &env.lease_ms));
  RETURN_IF_ERROR(ReadNumber(kEnvRanksOnGpu, &env.ranks_on_gpu));
  if (env.ranks_on_gpu < 1) {
    return InvalidArgumentError(std::string(kEnvRanksOnGpu) + "=" +
                                std::to_string(env.ranks_on_gpu) + " must be at least 1");
  }
  env.tls = {GetEnv(kEnvTlsCert), GetEnv(kEnvTlsKey), GetEnv(kEnvTlsCa)};
  env.bind_address = GetEnv(kEnvBindAddress);
  if (env.bind_address.empty()) env.bind_address = DefaultBindAddress(env.coordinator);
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return InvalidArgumentError(
        "DROVER_RANK=" + std::to_string(env.rank) +
        " must be in [0, DROVER_WORLD_SIZE=" + std::to_string(env.world_size) + ")");
  }
  return env;
}

}  // namespace drover
