// Host float arrays whose memory comes from an engine Allocator (kernels/ops.h): plain host
// memory by default, or a kernel table's host_allocator(), page-locked on CUDA, so that the
// copies of device arenas into them (checkpoint snapshots) run at the bus's rate instead of
// through the driver's pageable bounce buffers. A std::vector in every other respect.
//
// The allocator travels with the vector on moves and swaps; the memory is returned to the
// Allocator it came from, on whatever thread drops the vector (Allocators are thread-safe).
// Page-locked memory is slow to allocate: keep such a vector and reuse it (ckpt/async_writer.h
// hands the last shard back for that).
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "worker/engine/kernels/ops.h"

namespace drover::engine {

class HostFloatAllocator {
 public:
  using value_type = float;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;
  template <typename U>
  struct rebind {
    static_assert(std::is_same_v<U, float>, "an engine Allocator holds floats only");
    using other = HostFloatAllocator;
  };

  HostFloatAllocator() : allocator_(HostAllocator()) {}
  explicit HostFloatAllocator(Allocator* allocator) : allocator_(allocator) {}

  float* allocate(size_t n) { return allocator_->Allocate(n); }
  void deallocate(float* p, size_t) { allocator_->Free(p); }
  Allocator* allocator() const { return allocator_; }
  bool operator==(const HostFloatAllocator& o) const { return allocator_ == o.allocator_; }

 private:
  Allocator* allocator_;
};

using HostFloats = std::vector<float, HostFloatAllocator>;

}  // namespace drover::engine
