#include "worker/engine/model/global_part.h"

#include <algorithm>

#include "common/status.h"

namespace drover::engine {

GlobalPart::GlobalPart(std::vector<ElementRange> ranges) {
  std::erase_if(ranges, [](const ElementRange& r) { return r.begin >= r.end; });
  std::sort(ranges.begin(), ranges.end(),
            [](const ElementRange& a, const ElementRange& b) { return a.begin < b.begin; });
  size_t total = 0;
  for (const ElementRange& r : ranges) {
    if (!ranges_.empty() && r.begin <= ranges_.back().end) {
      const size_t grown = std::max(ranges_.back().end, r.end) - ranges_.back().end;
      ranges_.back().end += grown;
      total += grown;
      continue;
    }
    starts_.push_back(total);
    ranges_.push_back(r);
    total += r.end - r.begin;
  }
  values_.assign(total, 0.0f);
}

size_t GlobalPart::RangeAtOrAfter(size_t element) const {
  // The first range ending after `element`: it holds it or lies after it.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), element,
                             [](size_t e, const ElementRange& r) { return e < r.end; });
  return static_cast<size_t>(it - ranges_.begin());
}

bool GlobalPart::Holds(size_t begin, size_t end) const {
  if (begin >= end) return true;
  const size_t i = RangeAtOrAfter(begin);
  return i < ranges_.size() && ranges_[i].begin <= begin && end <= ranges_[i].end;
}

size_t GlobalPart::Index(size_t begin, size_t n) const {
  if (n == 0) return 0;
  const size_t i = RangeAtOrAfter(begin);
  DROVER_CHECK_MSG(i < ranges_.size() && ranges_[i].begin <= begin && begin + n <= ranges_[i].end,
                   "elements outside the part");
  return starts_[i] + (begin - ranges_[i].begin);
}

const float* GlobalPart::At(size_t begin, size_t n) const {
  return values_.data() + Index(begin, n);
}

float* GlobalPart::MutableAt(size_t begin, size_t n) { return values_.data() + Index(begin, n); }

}  // namespace drover::engine
