// The communicators of one rank of a mesh: the world and one group per mesh axis through
// this rank, plus the pipeline's embedding group (first and last stage of one dp/tp
// coordinate, which both hold the tied wte and sum its gradient). A group of one rank is
// null: there is nothing to communicate, and the engine skips it.
//
// Group names (keys in the bootstrap store) name the fixed coordinates, e.g. "dp.pp1.tp0",
// so every member derives the same name; every rank connects its groups in the same
// order (world, dp, pp, tp, emb), which keeps the rendezvous free of cycles.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/parallel_mesh.h"
#include "common/status.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/gloo_communicator.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::parallel {

struct ProcessGroups {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> dp;
  std::unique_ptr<Communicator> pp;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> emb;  // ranks {first stage, last stage}, when pp > 1
};

struct ConnectOptions {
  std::string bind_address = "127.0.0.1";  // where this rank accepts its peers
  CommOptions comm;                        // deadline of every operation
  // How long to wait for every peer to show up (ranks start at different times).
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};
};

// Connects rank `rank` of `mesh` to its groups through `store` (keys of this attempt only).
// DeadlineExceeded when a peer does not show up in time; errors name the group.
StatusOr<ProcessGroups> ConnectProcessGroups(const ParallelMesh& mesh, int rank, KvStore* store,
                                             const ConnectOptions& options);

}  // namespace drover::engine::parallel
