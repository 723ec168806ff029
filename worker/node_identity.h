// What makes an agent the same node across its restarts: an id kept in its work dir, and a
// lock that keeps two agents off one work dir (they would share that id).
#pragma once

#include <string>

#include "common/status.h"

namespace drover {

// <work_dir>/node_uid, created (random, durable) at the first start. The coordinator lets a
// restarted agent with the same uid take its node's name back, and refuses the name to a
// live node's namesake with another uid.
StatusOr<std::string> LoadOrCreateNodeUid(const std::string& work_dir);

// Takes an exclusive lock on <work_dir>/agent.lock for the life of the process (the fd is
// left open on purpose). FailedPrecondition naming the work dir when another process holds
// it.
Status LockWorkDir(const std::string& work_dir);

}  // namespace drover
