// Ring reduce-scatter and all-gather with per-rank counts over a Gloo group, for
// GlooCommunicator. Gloo's new API has neither (its reduce-scatter is in the old,
// bound-buffer API and its allgatherv is not in place), and an all-reduce followed by a
// slice would move twice the bytes: in a ring every rank sends (n - 1) / n of the buffer to
// its right neighbour and receives as much from its left, the bandwidth lower bound.
//
// Both are pipelined: each chunk travels in segments of `segment_bytes`, and a segment is
// forwarded (reduce-scatter: reduced, then forwarded) as soon as it arrives, so the ring's
// n - 1 steps overlap instead of each waiting for the whole previous chunk.
//
// Deadline: `group.timeout()` end to end, from the call. Failure breaks the group
// (gloo_group.h). Zero counts are allowed; ranks with an empty chunk send nothing for it.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/engine/parallel/communicator.h"
#include "worker/engine/parallel/gloo_group.h"

namespace drover::engine::parallel {

// 1 MiB: on loopback, 64 and 256 KiB segments lose to per-message cost and 4 MiB or
// unsegmented chunks lose the overlap of receiving with reducing (measurements in
// tests/bench/README.md, "Communication"). A multiple of every element size.
inline constexpr size_t kRingSegmentBytes = size_t{1} << 20;

// communicator.h's ReduceScatter on a group of size >= 2. `scratch` receives the left
// neighbour's segments; it is grown as needed and kept by the caller between calls.
Status RingReduceScatter(GlooGroup& group, void* data, std::span<const size_t> counts,
                         DataType type, ReduceOp op, std::vector<std::byte>& scratch,
                         size_t segment_bytes = kRingSegmentBytes);

// communicator.h's AllGather on a group of size >= 2; receives in place, needs no scratch.
Status RingAllGather(GlooGroup& group, void* data, std::span<const size_t> counts, DataType type,
                     size_t segment_bytes = kRingSegmentBytes);

// data[i] /= divisor for count elements of `type`: kAverage after a sum. Dividing (rather
// than multiplying by 1/divisor) keeps exact quotients exact.
void DivideInPlace(void* data, size_t count, DataType type, int divisor);

}  // namespace drover::engine::parallel
