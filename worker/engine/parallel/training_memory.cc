#include "worker/engine/parallel/training_memory.h"

#include <algorithm>

namespace drover::engine::parallel {

ShardPartition::ShardPartition(size_t n, int parts) : n(n), parts(parts) {
  DROVER_CHECK(parts >= 1);
  shard = ((n + parts - 1) / parts + 15) / 16 * 16;
}

size_t ShardPartition::begin(int r) const { return std::min(n, static_cast<size_t>(r) * shard); }

size_t ShardPartition::end(int r) const { return std::min(n, static_cast<size_t>(r + 1) * shard); }

std::vector<size_t> ShardPartition::Counts(size_t lo, size_t hi) const {
  std::vector<size_t> counts(parts);
  for (int r = 0; r < parts; ++r) {
    const size_t b = std::max(lo, begin(r)), e = std::min(hi, end(r));
    counts[r] = e > b ? e - b : 0;
  }
  return counts;
}

ReplicaShares::ReplicaShares(Communicator* replica, size_t owned_begin, size_t owned_end)
    : replica_(replica),
      owned_begin_(owned_begin),
      split_(owned_end - owned_begin, replica != nullptr ? replica->size() : 1) {}

size_t ReplicaShares::begin() const {
  return owned_begin_ + split_.begin(replica_ != nullptr ? replica_->rank() : 0);
}

size_t ReplicaShares::end() const {
  return owned_begin_ + split_.end(replica_ != nullptr ? replica_->rank() : 0);
}

void ReplicaShares::SubmitGather(CommStream* stream, float* whole) const {
  if (replica_ == nullptr) return;
  stream->Submit([this, owned = whole + owned_begin_, counts = split_.Counts(0, split_.n)] {
    return replica_->AllGather(owned, counts, DataType::kFloat32);
  });
}

std::vector<Bucket> PlanBuckets(const std::vector<Unit>& units, size_t bucket_floats,
                                const std::vector<int>& excluded, const std::vector<int>& alone) {
  auto in = [](const std::vector<int>& list, int u) {
    return std::find(list.begin(), list.end(), u) != list.end();
  };
  std::vector<Bucket> buckets;
  Bucket current;
  size_t size = 0;
  auto close = [&] {
    if (current.units.empty()) return;
    buckets.push_back(current);
    current = Bucket();
    size = 0;
  };
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    if (in(excluded, u) || in(alone, u)) {
      // Buckets must stay contiguous: a gap closes the current one.
      close();
      if (in(alone, u)) {
        current.units = {u};
        current.begin = units[u].offset;
        current.end = units[u].offset + units[u].numel;
        close();
      }
      continue;
    }
    if (current.units.empty()) current.end = units[u].offset + units[u].numel;
    current.units.push_back(u);
    current.begin = units[u].offset;
    size += units[u].numel;
    if (size >= bucket_floats) close();
  }
  close();
  return buckets;
}

std::vector<float> PackEmbeddingRows(Ops* ops, const int32_t* inputs, const float* dout, int B,
                                     int T, int C, float scale) {
  const size_t bt = static_cast<size_t>(B) * T;
  std::vector<float> packed(bt + bt * C);
  for (size_t i = 0; i < bt; ++i) packed[i] = static_cast<float>(inputs[i]);
  ops->ToHost(packed.data() + bt, dout, bt * C);
  for (size_t i = 0; i < bt * C; ++i) packed[bt + i] *= scale;
  return packed;
}

bool TiedUnitReadyAfterHeadOn(Ops* ops) {
  const Buffer probe = ops->Allocate(1);
  return !ops->IsDeviceMemory(probe.data());
}

void AddEmbeddingRows(Ops* ops, const float* packed, int B, int T, int C, size_t wpe_offset,
                      float* dwindow, size_t lo, size_t hi, Buffer* scratch) {
  const size_t bt = static_cast<size_t>(B) * T;
  std::vector<int32_t> ids(bt);
  for (size_t i = 0; i < bt; ++i) ids[i] = static_cast<int32_t>(packed[i]);
  if (scratch->size() < bt * C) *scratch = ops->Allocate(bt * C);
  ops->FromHost(scratch->data(), packed + bt, bt * C);
  ops->EncoderBackwardWindow(dwindow, lo, hi, wpe_offset, scratch->data(), ids.data(), B, T, C);
}

}  // namespace drover::engine::parallel
