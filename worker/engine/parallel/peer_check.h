// PeerCheck: before a job's ranks connect their process groups, whether every rank can open a
// TCP connection to every other one, and when some cannot, which ranks are cut off.
//
// Why: a node that lost its data network but kept a way to the coordinator (a NIC, a cable or
// a switch port gone on one network of two, or routes gone) fails the job in a way that
// names the wrong node. Mid-run, every collective times out and whichever rank notices first
// is blamed; at the next attempt's start the connect hangs until the coordinator's hang
// detector fires, again on an arbitrary rank. The coordinator then places the next attempt on
// the same nodes, and the job spends its restarts on a node that cannot work. The check
// finds the node at fault: each rank listens, publishes its address, connects to every peer
// within a deadline, publishes whom it could not reach, and reads every rank's findings, so
// that all ranks reach the same verdict from the same matrix (CutOffRanks). The trainer
// reports the verdict to its agent, and the coordinator cordons the node (worker/engine/
// trainer.cc, coordinator/job_manager.cc).
//
// It probes the path Gloo's connections take (the trainers' bind addresses). NCCL picks its
// own transports (InfiniBand, other interfaces), which this does not test.
//
// Thread-safety: CheckPeers blocks its caller; it runs one listener thread while it does.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::parallel {

struct PeerCheckOptions {
  std::string bind_address = "127.0.0.1";  // where this rank accepts its peers
  // How long to wait for every rank to publish its address, then its findings (ranks start
  // at different times).
  std::chrono::milliseconds arrival_timeout{std::chrono::minutes(5)};
  // How long one connection may take to be accepted before its peer counts as unreachable.
  std::chrono::milliseconds probe_timeout{std::chrono::seconds(5)};
};

// unreachable[r]: the ranks rank r could not connect to, ascending.
using Reachability = std::vector<std::vector<int>>;

// What every rank of a check found, the same on every rank.
struct PeerCheckResult {
  Reachability unreachable;
  std::vector<std::string> addresses;  // each rank's listening address, "host:port"
};

// Runs the check as `rank` of `size` through `store` (keys under "peers/"; one check per
// store). Errors: the store's (DeadlineExceeded when a rank never publishes), or a listener
// that cannot be opened on the bind address.
StatusOr<PeerCheckResult> CheckPeers(KvStore* store, int rank, int size,
                                     const PeerCheckOptions& options);

// The ranks to blame for the failed connections: repeatedly the rank in the most failed
// pairs (a pair fails when either end could not reach the other; the lowest rank on a tie)
// until every failed pair has one. A rank whose node lost its network is in a failed pair
// with every peer and is named alone; one broken link between two nodes names one of its
// ends. Empty when every pair connected.
std::vector<int> CutOffRanks(const Reachability& unreachable);

// "rank 0 (10.0.0.11:4321) could not reach ranks 1, 2; rank 1 (...) could not reach rank 0;
// ...", for every rank with a failed connection.
std::string DescribeReachability(const PeerCheckResult& result);

}  // namespace drover::engine::parallel
