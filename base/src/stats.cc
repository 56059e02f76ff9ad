#include "moeplan/base/stats.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace moeplan {

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const auto mid = static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[static_cast<size_t>(mid)];
  if (v.size() % 2 == 1) return upper;
  // After nth_element the lower half holds the smaller values: its maximum is
  // the other middle value.
  return 0.5 * (*std::max_element(v.begin(), v.begin() + mid) + upper);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (rank - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double Mean(std::span<const double> v) {
  if (v.empty()) return 0.0;
  double sum = 0.0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

}  // namespace moeplan
