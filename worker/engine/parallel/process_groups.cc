#include "worker/engine/parallel/process_groups.h"

#include <algorithm>
#include <vector>

namespace drover::engine::parallel {
namespace {

// Connects `rank` to the group of world ranks `members` (ascending, `rank` among them)
// named `name`; null when the group has one member. Blocks until every member joined.
StatusOr<std::unique_ptr<Communicator>> Join(const GroupConnector& connect, const std::string& name,
                                             const std::vector<int>& members, int rank,
                                             GroupCaller caller = GroupCaller::kTrainingThread) {
  if (members.size() <= 1) return std::unique_ptr<Communicator>();
  const auto it = std::find(members.begin(), members.end(), rank);
  DROVER_CHECK_MSG(it != members.end(), "rank not in its own group");
  return connect(name, static_cast<int>(it - members.begin()), static_cast<int>(members.size()),
                 caller);
}

// Every group of `groups`, in connection order.
std::vector<const std::unique_ptr<Communicator>*> All(const ProcessGroups& groups) {
  return {&groups.world,   &groups.dp,           &groups.dp_replica, &groups.pp, &groups.pp_grad,
          &groups.pp_wrap, &groups.pp_grad_wrap, &groups.tp,         &groups.emb};
}

std::string Coords(const char* a, int x, const char* b, int y) {
  return std::string(a) + std::to_string(x) + "." + b + std::to_string(y);
}

}  // namespace

double WaitSeconds(const ProcessGroups& groups) {
  double seconds = 0;
  for (const auto* group : All(groups)) {
    if (*group != nullptr) seconds += (*group)->wait_seconds();
  }
  return seconds;
}

Status SyncAll(const ProcessGroups& groups) {
  for (const auto* group : All(groups)) {
    if (*group == nullptr) continue;
    RETURN_IF_ERROR((*group)->Sync());
  }
  return OkStatus();
}

StatusOr<ProcessGroups> ConnectProcessGroups(const ParallelMesh& mesh, int rank,
                                             const GroupConnector& connect) {
  ProcessGroups groups;
  if (mesh.world_size() == 1) return groups;
  const ParallelMesh::Coord c = mesh.CoordOf(rank);
  std::vector<int> world(mesh.world_size());
  for (int r = 0; r < mesh.world_size(); ++r) world[r] = r;
  ASSIGN_OR_RETURN(groups.world, Join(connect, "world", world, rank));
  // Under hybrid sharding several shard groups share a (pp, tp) coordinate: the name
  // carries the replica, and the replica group's the position in the shard.
  const std::string dp_name = "dp." + Coords("pp", c.pp, "tp", c.tp);
  const bool hybrid = mesh.dp_replicas() > 1;
  ASSIGN_OR_RETURN(
      groups.dp,
      Join(connect, hybrid ? dp_name + ".r" + std::to_string(c.dp / mesh.dp_shard()) : dp_name,
           mesh.DpShardGroup(rank), rank, GroupCaller::kCommStream));
  ASSIGN_OR_RETURN(groups.dp_replica,
                   Join(connect,
                        "dprep." + Coords("pp", c.pp, "tp", c.tp) + ".s" +
                            std::to_string(c.dp % mesh.dp_shard()),
                        mesh.DpReplicaGroup(rank), rank, GroupCaller::kCommStream));
  ASSIGN_OR_RETURN(groups.pp,
                   Join(connect, "pp." + Coords("dp", c.dp, "tp", c.tp), mesh.PpGroup(rank), rank));
  ASSIGN_OR_RETURN(groups.pp_grad, Join(connect, "ppgrad." + Coords("dp", c.dp, "tp", c.tp),
                                        mesh.PpGroup(rank), rank));
  const bool ends = mesh.pp() > 1 && (c.pp == 0 || c.pp == mesh.pp() - 1);
  if (ends && mesh.pp_chunks() > 1) {
    const std::vector<int> stages = mesh.PpGroup(rank);
    const std::vector<int> pair = {stages.front(), stages.back()};
    ASSIGN_OR_RETURN(groups.pp_wrap,
                     Join(connect, "ppwrap." + Coords("dp", c.dp, "tp", c.tp), pair, rank));
    ASSIGN_OR_RETURN(groups.pp_grad_wrap,
                     Join(connect, "ppgradwrap." + Coords("dp", c.dp, "tp", c.tp), pair, rank));
  }
  ASSIGN_OR_RETURN(groups.tp,
                   Join(connect, "tp." + Coords("pp", c.pp, "dp", c.dp), mesh.TpGroup(rank), rank));
  if (ends) {
    const std::vector<int> stages = mesh.PpGroup(rank);
    ASSIGN_OR_RETURN(groups.emb, Join(connect, "emb." + Coords("dp", c.dp, "tp", c.tp),
                                      {stages.front(), stages.back()}, rank));
  }
  return groups;
}

StatusOr<ProcessGroups> ConnectProcessGroups(const ParallelMesh& mesh, int rank, KvStore* store,
                                             const ConnectOptions& options) {
  if (mesh.world_size() == 1) return ProcessGroups{};
  ASSIGN_OR_RETURN(std::shared_ptr<GlooTransport> transport,
                   GlooTransport::Create(options.bind_address));
  return ConnectProcessGroups(
      mesh, rank, [&](const std::string& name, int rank_in_group, int size, GroupCaller) {
        return ConnectGlooGroup(transport, store, name, rank_in_group, size, options.comm,
                                options.connect_timeout);
      });
}

}  // namespace drover::engine::parallel
