#include "worker/engine/parallel/gloo_ring.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace drover::engine::parallel {
namespace {

using gloo::transport::UnboundBuffer;

// Slot prefixes of the ring collectives: above Gloo's own (0x01..0x08) and below the
// point-to-point space (gloo_communicator.cc), so no two kinds of message ever share a slot.
constexpr uint8_t kReduceScatterSlotPrefix = 0x20;
constexpr uint8_t kAllGatherSlotPrefix = 0x21;

// Receives posted ahead of the one being waited for: one lands while another is reduced.
constexpr size_t kReceiveWindow = 2;

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Byte layout of the chunks (chunk r belongs to rank r) and of their segments.
class ChunkLayout {
 public:
  ChunkLayout(std::span<const size_t> counts, size_t element_bytes, size_t segment_bytes)
      : segment_bytes_(segment_bytes / element_bytes * element_bytes) {
    DROVER_CHECK_MSG(segment_bytes_ > 0, "segment smaller than one element");
    size_t offset = 0;
    for (size_t count : counts) {
      offsets_.push_back(offset);
      offset += count * element_bytes;
    }
    offsets_.push_back(offset);
  }

  size_t total_bytes() const { return offsets_.back(); }
  size_t offset(int chunk) const { return offsets_[chunk]; }
  size_t bytes(int chunk) const { return offsets_[chunk + 1] - offsets_[chunk]; }
  size_t segments(int chunk) const { return (bytes(chunk) + segment_bytes_ - 1) / segment_bytes_; }
  size_t segment_offset(int chunk, size_t j) const { return offset(chunk) + j * segment_bytes_; }
  size_t segment_bytes(int chunk, size_t j) const {
    return std::min(segment_bytes_, bytes(chunk) - j * segment_bytes_);
  }
  size_t max_segment_bytes() const {
    size_t largest = 0;
    for (size_t c = 0; c + 1 < offsets_.size(); ++c) largest = std::max(largest, bytes(c));
    return std::min(largest, segment_bytes_);
  }

 private:
  const size_t segment_bytes_;
  std::vector<size_t> offsets_;  // size() + 1 entries; the last is the total
};

// One segment moving one hop along the ring in step `step`.
struct Hop {
  int step;
  int chunk;
  size_t segment;
};

// One pass around the ring. In step s (0 <= s < n - 1) this rank sends chunk `first + 1 - s`
// to its right neighbour and receives chunk `first - s` from its left one, so each chunk it
// receives in step s is the chunk it sends in step s + 1: a segment is forwarded as soon as
// `consume` has run on it. Both neighbours derive the same hops in the same order from the
// same counts, which is what pairs every send with its receive on the shared slot.
//
// post(hop, g) posts the g-th receive; consume(hop, g, timeout) waits for it and uses it.
// Throws (inside GlooGroup::Run) on any failure.
template <typename Post, typename Consume>
void RunRing(GlooGroup& group, GlooOp& op, const ChunkLayout& layout, int first, uint64_t slot,
             UnboundBuffer& data, GlooClock::time_point deadline, Post post, Consume consume) {
  const int n = group.size();
  const int left = Mod(group.rank() - 1, n);
  const int right = Mod(group.rank() + 1, n);

  std::vector<Hop> received;
  for (int s = 0; s < n - 1; ++s) {
    const int chunk = Mod(first - s, n);
    for (size_t j = 0; j < layout.segments(chunk); ++j) received.push_back({s, chunk, j});
  }

  size_t sends = 0;
  auto send = [&](int chunk, size_t j) {
    data.send(right, slot, layout.segment_offset(chunk, j), layout.segment_bytes(chunk, j));
    ++sends;
  };
  const int first_sent = Mod(first + 1, n);
  for (size_t j = 0; j < layout.segments(first_sent); ++j) send(first_sent, j);
  for (size_t g = 0; g < std::min(kReceiveWindow, received.size()); ++g) post(received[g], g);

  for (size_t g = 0; g < received.size(); ++g) {
    const Hop& hop = received[g];
    op.peer = left;
    consume(hop, g, GlooGroup::Remaining(deadline));
    if (g + kReceiveWindow < received.size())
      post(received[g + kReceiveWindow], g + kReceiveWindow);
    if (hop.step + 1 < n - 1) send(hop.chunk, hop.segment);
  }

  op.peer = right;
  for (size_t i = 0; i < sends; ++i) {
    if (!data.waitSend(GlooGroup::Remaining(deadline))) throw std::runtime_error("send aborted");
  }
}

void WaitReceived(UnboundBuffer& buffer, std::chrono::milliseconds timeout) {
  if (!buffer.waitRecv(timeout)) throw std::runtime_error("receive aborted");
}

template <typename T>
void AddInto(T* __restrict dst, const T* __restrict src, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] += src[i];
}

void AddInto(void* dst, const void* src, size_t bytes, DataType type) {
  switch (type) {
    case DataType::kFloat32:
      AddInto(static_cast<float*>(dst), static_cast<const float*>(src), bytes / sizeof(float));
      return;
    case DataType::kFloat64:
      AddInto(static_cast<double*>(dst), static_cast<const double*>(src), bytes / sizeof(double));
      return;
  }
}

}  // namespace

Status RingReduceScatter(GlooGroup& group, void* data, std::span<const size_t> counts,
                         DataType type, ReduceOp op, std::vector<std::byte>& scratch,
                         size_t segment_bytes) {
  const auto deadline = GlooClock::now() + group.timeout();
  const uint32_t tag = group.NextCollectiveTag();
  const ChunkLayout layout(counts, SizeOf(type), segment_bytes);
  GlooOp gloo_op{"ReduceScatter"};
  if (!group.error().ok()) return group.error();
  if (layout.total_bytes() == 0) return OkStatus();

  const size_t slot_bytes = layout.max_segment_bytes();
  if (scratch.size() < kReceiveWindow * slot_bytes) scratch.resize(kReceiveWindow * slot_bytes);
  auto* bytes = static_cast<std::byte*>(data);
  // Declared out here so that on failure they outlive GlooGroup::Run's closing of the
  // connections: Gloo's event loop never sees a receive whose buffer is gone.
  std::unique_ptr<UnboundBuffer> data_buffer;
  std::vector<std::unique_ptr<UnboundBuffer>> slots;
  RETURN_IF_ERROR(group.Run(gloo_op, [&] {
    gloo::Context& context = *group.context();
    data_buffer = context.createUnboundBuffer(data, layout.total_bytes());
    for (size_t k = 0; k < kReceiveWindow; ++k) {
      slots.push_back(context.createUnboundBuffer(scratch.data() + k * slot_bytes, slot_bytes));
    }
    const int left = Mod(group.rank() - 1, group.size());
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, tag);
    auto post = [&](const Hop& hop, size_t g) {
      slots[g % kReceiveWindow]->recv(left, slot, 0, layout.segment_bytes(hop.chunk, hop.segment));
    };
    auto consume = [&](const Hop& hop, size_t g, std::chrono::milliseconds timeout) {
      UnboundBuffer& landed = *slots[g % kReceiveWindow];
      WaitReceived(landed, timeout);
      AddInto(bytes + layout.segment_offset(hop.chunk, hop.segment), landed.ptr,
              layout.segment_bytes(hop.chunk, hop.segment), type);
    };
    // Chunk rank - 2 arrives first (the left neighbour's own part of it); after n - 1
    // steps the last to arrive, reduced over every rank, is chunk rank.
    RunRing(group, gloo_op, layout, group.rank() - 2, slot, *data_buffer, deadline, post, consume);
  }));
  if (op == ReduceOp::kAverage) {
    const int own = group.rank();
    DivideInPlace(bytes + layout.offset(own), counts[own], type, group.size());
  }
  return OkStatus();
}

Status RingAllGather(GlooGroup& group, void* data, std::span<const size_t> counts, DataType type,
                     size_t segment_bytes) {
  const auto deadline = GlooClock::now() + group.timeout();
  const uint32_t tag = group.NextCollectiveTag();
  const ChunkLayout layout(counts, SizeOf(type), segment_bytes);
  GlooOp gloo_op{"AllGather"};
  if (!group.error().ok()) return group.error();
  if (layout.total_bytes() == 0) return OkStatus();

  auto* bytes = static_cast<std::byte*>(data);
  // Out here for the reason given in RingReduceScatter. Received segments land in place,
  // each through its own buffer, so that waiting for one says which one arrived.
  std::unique_ptr<UnboundBuffer> data_buffer;
  std::vector<std::unique_ptr<UnboundBuffer>> landing;
  return group.Run(gloo_op, [&] {
    gloo::Context& context = *group.context();
    data_buffer = context.createUnboundBuffer(data, layout.total_bytes());
    const int left = Mod(group.rank() - 1, group.size());
    const uint64_t slot = gloo::Slot::build(kAllGatherSlotPrefix, tag);
    auto post = [&](const Hop& hop, size_t g) {
      DROVER_CHECK(g == landing.size());
      landing.push_back(
          context.createUnboundBuffer(bytes + layout.segment_offset(hop.chunk, hop.segment),
                                      layout.segment_bytes(hop.chunk, hop.segment)));
      landing.back()->recv(left, slot);
    };
    auto consume = [&](const Hop&, size_t g, std::chrono::milliseconds timeout) {
      WaitReceived(*landing[g], timeout);
    };
    // The first chunk sent is this rank's own; the first received, its left neighbour's.
    RunRing(group, gloo_op, layout, group.rank() - 1, slot, *data_buffer, deadline, post, consume);
  });
}

void DivideInPlace(void* data, size_t count, DataType type, int divisor) {
  switch (type) {
    case DataType::kFloat32: {
      auto* x = static_cast<float*>(data);
      const auto d = static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) x[i] /= d;
      return;
    }
    case DataType::kFloat64: {
      auto* x = static_cast<double*>(data);
      const auto d = static_cast<double>(divisor);
      for (size_t i = 0; i < count; ++i) x[i] /= d;
      return;
    }
  }
}

}  // namespace drover::engine::parallel
