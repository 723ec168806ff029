// The contract between the worker agent and a trainer process it launches: environment
// variables the agent sets, which the trainer reads at start-up.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/tls.h"

namespace drover {

inline constexpr char kEnvCoordinator[] = "DROVER_COORDINATOR";  // host:port, rendezvous
inline constexpr char kEnvJobId[] = "DROVER_JOB_ID";
inline constexpr char kEnvAttempt[] = "DROVER_ATTEMPT";
inline constexpr char kEnvRank[] = "DROVER_RANK";
inline constexpr char kEnvWorldSize[] = "DROVER_WORLD_SIZE";
inline constexpr char kEnvLocalRank[] = "DROVER_LOCAL_RANK";
// The slot on its node. A CUDA trainer sees only its slot's GPU (the agent sets
// CUDA_VISIBLE_DEVICES), as its device 0.
inline constexpr char kEnvSlot[] = "DROVER_SLOT";
inline constexpr char kEnvSpecPath[] = "DROVER_SPEC";             // effective job spec YAML
inline constexpr char kEnvStatusFd[] = "DROVER_STATUS_FD";        // pipe for TrainerReport lines
inline constexpr char kEnvResume[] = "DROVER_RESUME_CHECKPOINT";  // step_N/ dir or empty
inline constexpr char kEnvThreads[] = "DROVER_THREADS";
// "1": ignore existing checkpoints in checkpoint.dir (`drover train --fresh`).
inline constexpr char kEnvFresh[] = "DROVER_FRESH";
// Where this rank accepts connections from its peers (an address of this node). Unset:
// 127.0.0.1 when the coordinator is on loopback, else the host name.
inline constexpr char kEnvBindAddress[] = "DROVER_BIND_ADDRESS";
// Set by an agent: the validity (ms) of the trainer's lease on its attempt, shorter than the
// coordinator's node timeout (worker/attempt_lease.h). Unset: no lease (`drover train`).
inline constexpr char kEnvLeaseMs[] = "DROVER_LEASE_MS";
// Set by `drover train --nproc` where its ranks outnumber the GPUs: how many ranks share this
// rank's GPU (round-robin), each counting that share of the GPU's peak in its MFU. Unset: 1.
inline constexpr char kEnvRanksOnGpu[] = "DROVER_RANKS_ON_GPU";

// Set by an agent that dials the coordinator with TLS: the files (absolute paths on this
// node) of its cluster certificate, key and CA, with which the trainer dials rendezvous.
// Unset or empty: plaintext.
inline constexpr char kEnvTlsCert[] = "DROVER_TLS_CERT";
inline constexpr char kEnvTlsKey[] = "DROVER_TLS_KEY";
inline constexpr char kEnvTlsCa[] = "DROVER_TLS_CA";

// What a trainer learns from its environment.
struct TrainerEnv {
  std::string coordinator;
  std::string job_id;
  int64_t attempt = 0;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int slot = 0;
  std::string spec_path;
  int status_fd = -1;  // -1 when not launched by an agent
  std::string resume_checkpoint;
  int threads = 1;
  bool fresh = false;
  std::string bind_address;  // resolved: never empty
  int64_t lease_ms = 0;      // 0: no lease
  int ranks_on_gpu = 1;      // ranks sharing this rank's GPU, itself included
  TlsFiles tls;              // all empty: plaintext
};

// Reads the variables above. Missing optional ones keep their defaults; a malformed number
// is InvalidArgument naming the variable.
StatusOr<TrainerEnv> ReadTrainerEnv();

}  // namespace drover
