#include "coordinator/store/store.h"

namespace drover::coordinator {

void StoreBatch::Append(StoreBatch other) {
  for (auto& j : other.jobs) jobs.push_back(std::move(j));
  for (auto& a : other.attempts) attempts.push_back(std::move(a));
  for (auto& n : other.nodes) nodes.push_back(std::move(n));
  for (auto& c : other.checkpoints) checkpoints.push_back(std::move(c));
  for (auto& [k, v] : other.counters) counters[k] = v;
  for (auto& id : other.deleted_jobs) deleted_jobs.push_back(std::move(id));
}

}  // namespace drover::coordinator
