// One batch's token ids grouped by id, built on the host (where the ids arrive from the
// data loader) for the CUDA embedding backward (encoder.cu). With the occurrences of each
// id listed in order, one thread per (id, channel) adds that id's dout rows in a fixed
// order: deterministic without atomics, and parallel over the distinct ids, where one
// thread per channel walking all B*T rows serialised them. A counting sort, O(n + max id).
// Plain C++, no CUDA: nvcc and the host compiler (tests/unit/.../token_buckets_test.cc) both
// read it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace drover::engine::cuda {

class TokenBuckets {
 public:
  // Groups the ids >= 0 of ids[0, n); a -1 (a token whose row another tensor-parallel rank
  // holds, ops.h) is left out: it adds no row. Reuses its memory from call to call.
  void Build(const int32_t* ids, int n) {
    int32_t max_id = 0;
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      max_id = std::max(max_id, ids[i]);
      kept += ids[i] >= 0 ? 1 : 0;
    }
    // starts_[v] becomes where id v's occurrences begin among the kept positions.
    starts_.assign(static_cast<size_t>(max_id) + 2, 0);
    for (int i = 0; i < n; ++i) {
      if (ids[i] >= 0) ++starts_[static_cast<size_t>(ids[i]) + 1];
    }
    distinct_ = 0;
    for (size_t v = 1; v < starts_.size(); ++v) {
      distinct_ += starts_[v] > 0 ? 1 : 0;
      starts_[v] += starts_[v - 1];
    }
    count_ = n;
    packed_.resize(2 * static_cast<size_t>(distinct_) + 1 + kept);
    int32_t* id = packed_.data();
    int32_t* start = id + distinct_;
    int32_t* position = start + distinct_ + 1;
    int j = 0;
    for (int32_t v = 0; v <= max_id; ++v) {
      if (starts_[v + 1] == starts_[v]) continue;
      id[j] = v;
      start[j] = starts_[v];
      ++j;
    }
    start[distinct_] = kept;
    // Stable: each id's positions ascend, the order the CPU adds them in.
    for (int i = 0; i < n; ++i) {
      if (ids[i] >= 0) position[starts_[ids[i]]++] = i;
    }
  }

  // [distinct ids, ascending | distinct + 1 starts | kept positions]: the occurrences of
  // id[j] are position[start[j], start[j + 1]), each a row index b * T + t. One array, so
  // that one copy puts it on the device.
  const std::vector<int32_t>& packed() const { return packed_; }
  int distinct() const { return distinct_; }
  int count() const { return count_; }

 private:
  std::vector<int32_t> starts_;  // counting-sort scratch
  std::vector<int32_t> packed_;
  int distinct_ = 0;
  int count_ = 0;
};

}  // namespace drover::engine::cuda
