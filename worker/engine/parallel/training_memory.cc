#include "worker/engine/parallel/training_memory.h"

#include <algorithm>

namespace drover::engine::parallel {

ShardPartition::ShardPartition(size_t n, int parts) : n(n), parts(parts) {
  DROVER_CHECK(parts >= 1);
  shard = ((n + parts - 1) / parts + 15) / 16 * 16;
}

size_t ShardPartition::begin(int r) const { return std::min(n, static_cast<size_t>(r) * shard); }

size_t ShardPartition::end(int r) const {
  return std::min(n, static_cast<size_t>(r + 1) * shard);
}

std::vector<size_t> ShardPartition::Counts(size_t lo, size_t hi) const {
  std::vector<size_t> counts(parts);
  for (int r = 0; r < parts; ++r) {
    const size_t b = std::max(lo, begin(r)), e = std::min(hi, end(r));
    counts[r] = e > b ? e - b : 0;
  }
  return counts;
}

std::vector<Bucket> PlanBuckets(const std::vector<Unit>& units, size_t bucket_floats,
                                const std::vector<int>& excluded) {
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
    if (std::find(excluded.begin(), excluded.end(), u) != excluded.end()) {
      // Buckets must stay contiguous: a gap closes the current one.
      close();
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

}  // namespace drover::engine::parallel
