#include "coordinator/checkpoint_registry.h"

namespace drover::coordinator {

bool CheckpointRegistry::Add(const v1::CheckpointRecord& record) {
  auto& steps = by_job_[record.job_id()];
  return steps.emplace(record.step(), record).second;
}

const v1::CheckpointRecord* CheckpointRegistry::Newest(const std::string& job_id) const {
  auto it = by_job_.find(job_id);
  if (it == by_job_.end() || it->second.empty()) return nullptr;
  return &it->second.rbegin()->second;
}

std::vector<v1::CheckpointRecord> CheckpointRegistry::ForJob(const std::string& job_id) const {
  std::vector<v1::CheckpointRecord> out;
  auto it = by_job_.find(job_id);
  if (it == by_job_.end()) return out;
  for (const auto& [step, rec] : it->second) out.push_back(rec);
  return out;
}

}  // namespace drover::coordinator
