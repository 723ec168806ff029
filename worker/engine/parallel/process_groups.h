// The communicators of one rank of a mesh: the world and one group per mesh axis through
// this rank, plus the pipeline's embedding group (first and last stage of one dp/tp
// coordinate, which both hold the tied wte and sum its gradient). A group of one rank is
// null: there is nothing to communicate, and the engine skips it.
//
// Group names (keys in the bootstrap store) name the fixed coordinates, e.g. "dp.pp1.tp0",
// so every member derives the same name; every rank connects its groups in the same
// order (world, dp, dp_replica, pp, pp_grad, pp_wrap, pp_grad_wrap, tp, emb), which keeps
// the rendezvous free of cycles.
#pragma once

#include <chrono>
#include <functional>
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
  // The dp ranks ZeRO shards over: all of them, or under hybrid sharding
  // (parallel.dp_shard) this rank's shard group.
  std::unique_ptr<Communicator> dp;
  // Under hybrid sharding, the ranks of the other replicas that hold the same shard as this
  // one (ParallelMesh::DpReplicaGroup); null otherwise. Called from the dp CommStream too.
  std::unique_ptr<Communicator> dp_replica;
  std::unique_ptr<Communicator> pp;
  // The pipeline's gradients (to the previous stage), when pp > 1, apart from its activations
  // (on `pp`, to the next stage): NCCL runs a communicator's sends and receives in call order
  // on one stream, and a send waits for its receive, so in 1F1B's steady state a stage
  // sending an activation up while its neighbour sends a gradient down would wait on each
  // other for good on one communicator. Null: gradients share `pp`.
  std::unique_ptr<Communicator> pp_grad;
  // The interleaved schedule's transfers between the last and the first stage, which hand a
  // micro-batch to the next model chunk: activations (last -> first) and their gradients
  // (first -> last), each on a group of those two ranks (member 0 the first stage, 1 the
  // last), when pp > 1 and pp_chunks > 1, else null. Apart from pp and pp_grad for the same
  // reason as pp_grad: on one NCCL communicator the ring's back edge would turn the
  // pipeline's sends, each waiting for its receive, into a cycle that never completes
  // (tests/unit/worker/engine/parallel/pipeline_test.cc runs the schedules that way).
  std::unique_ptr<Communicator> pp_wrap;
  std::unique_ptr<Communicator> pp_grad_wrap;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> emb;  // ranks {first stage, last stage}, when pp > 1
};

struct ConnectOptions {
  std::string bind_address = "127.0.0.1";  // where this rank accepts its peers
  CommOptions comm;                        // deadline of every operation
  // How long to wait for every peer to show up (ranks start at different times).
  std::chrono::milliseconds connect_timeout{std::chrono::minutes(5)};
};

// Seconds this rank has waited in all its groups (Communicator::wait_seconds, summed). A dp
// group's calls on its CommStream are not in it: what the rank stalled for them is
// (StepResult::comm_overlapped_waits_s), since backward ran beside them. Any thread.
double WaitSeconds(const ProcessGroups& groups);

// Who calls a group, which decides whether its calls may be stream-ordered
// (CommOptions::stream_ordered): the training thread's groups (tp, pp, the embedding's, the
// world) may, since what reads their results next is its own compute; the dp group's calls
// are made on its CommStream, whose waits time them and whose bucket is done when its call
// returns (data_parallel.h), so they must return complete.
enum class GroupCaller { kTrainingThread, kCommStream };

// Connects this rank to the group `name` of `size` ranks as its member `rank_in_group`
// (blocking until every member joined): one backend's way to make a communicator.
using GroupConnector = std::function<StatusOr<std::unique_ptr<Communicator>>(
    const std::string& name, int rank_in_group, int size, GroupCaller caller)>;

// Every group's Sync (Communicator::Sync): OK once every call made so far completed, else
// the first error (which names its group).
Status SyncAll(const ProcessGroups& groups);

// Connects rank `rank` of `mesh` to its groups through `connect`. Errors name the group.
StatusOr<ProcessGroups> ConnectProcessGroups(const ParallelMesh& mesh, int rank,
                                             const GroupConnector& connect);

// The same with Gloo groups through `store` (keys of this attempt only). DeadlineExceeded
// when a peer does not show up in time.
StatusOr<ProcessGroups> ConnectProcessGroups(const ParallelMesh& mesh, int rank, KvStore* store,
                                             const ConnectOptions& options);

}  // namespace drover::engine::parallel
