// The median of a few numbers, for the decisions that must not turn on one outlier (a
// trainer's step times, a job's ranks).
#pragma once

#include <algorithm>
#include <vector>

namespace drover {

// The middle value of `values` (the mean of the two middle ones for an even count); 0 for
// none.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return (*std::max_element(values.begin(), values.begin() + mid) + upper) / 2;
}

}  // namespace drover
