// GlobalPart: some elements of a global arena (gpt_layout.h), held compactly.
//
// A rank of a parallel job resumes from a checkpoint of the global arenas, of which it holds
// only a part: its pipeline stage's layers, its tensor-parallel slice of them, and under ZeRO
// its slice of the optimizer state. A GlobalPart holds the elements a rank needs and no
// others, so that a restore reads and keeps (world size)-times less than the whole model
// (ckpt/checkpoint.h: ReadCheckpointPart).
//
// The elements are a set of global ranges [begin, end), kept sorted and merged, and their
// values back to back in range order.
//
// Thread-safety: a value. Concurrent writers through MutableAt of disjoint elements are
// safe (the checkpoint reader fills one part from several files at once).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace drover::engine {

// Global elements [begin, end).
struct ElementRange {
  size_t begin = 0, end = 0;
  friend bool operator==(const ElementRange&, const ElementRange&) = default;
};

class GlobalPart {
 public:
  GlobalPart() = default;
  // The elements of `ranges`, in any order, overlapping or not (empty ones are dropped),
  // their values zero.
  explicit GlobalPart(std::vector<ElementRange> ranges);
  // Every element of an arena of n.
  static GlobalPart Whole(size_t n) { return GlobalPart({{0, n}}); }

  // Sorted, disjoint and not adjacent (adjacent ones are merged).
  const std::vector<ElementRange>& ranges() const { return ranges_; }
  size_t size() const { return values_.size(); }  // elements held
  // One past the last element held (0 when empty).
  size_t end() const { return ranges_.empty() ? 0 : ranges_.back().end; }
  bool Holds(size_t begin, size_t end) const;  // every element of [begin, end)

  // The values of global elements [begin, begin + n), which must all be held (CHECKed):
  // held elements in one range are contiguous, and a request is always inside one range of
  // what it was made from.
  const float* At(size_t begin, size_t n) const;
  float* MutableAt(size_t begin, size_t n);

  // Calls fn(global_begin, global_end) for each held piece of [begin, end), in order.
  template <typename Fn>
  void ForEachHeld(size_t begin, size_t end, Fn&& fn) const;

  // The values, in range order (for Whole(n): the arena itself), taken out.
  std::vector<float> TakeValues() && { return std::move(values_); }

 private:
  // Index of the range holding `element` or, if none does, of the first range after it.
  size_t RangeAtOrAfter(size_t element) const;
  size_t Index(size_t begin, size_t n) const;  // into values_; CHECKs

  std::vector<ElementRange> ranges_;
  std::vector<size_t> starts_;  // starts_[i]: where range i's values begin in values_
  std::vector<float> values_;
};

template <typename Fn>
void GlobalPart::ForEachHeld(size_t begin, size_t end, Fn&& fn) const {
  for (size_t i = RangeAtOrAfter(begin); i < ranges_.size() && ranges_[i].begin < end; ++i) {
    const size_t b = ranges_[i].begin > begin ? ranges_[i].begin : begin;
    const size_t e = ranges_[i].end < end ? ranges_[i].end : end;
    if (b < e) fn(b, e);
  }
}

}  // namespace drover::engine
