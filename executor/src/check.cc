#include "moeplan/executor/check.h"

#include <algorithm>
#include <cmath>

namespace moeplan::executor {
namespace {
TensorDiff Diff(std::string name, const std::vector<float>& ref, const std::vector<float>& got) {
  TensorDiff d;
  d.tensor = std::move(name);
  if (ref.size() != got.size()) {
    d.max_abs_diff = INFINITY;
    return d;
  }
  for (size_t i = 0; i < ref.size(); ++i) {
    d.max_abs_ref = std::max(d.max_abs_ref, std::fabs(static_cast<double>(ref[i])));
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    // NaN anywhere fails the comparison.
    d.max_abs_diff = std::isnan(diff) ? INFINITY : std::max(d.max_abs_diff, diff);
  }
  return d;
}
}  // namespace

std::vector<TensorDiff> CompareResults(const LayerResults& ref, const LayerResults& got) {
  return {Diff("y", ref.y, got.y), Diff("dx", ref.dx, got.dx), Diff("dgate", ref.dgate, got.dgate),
          Diff("dw1", ref.dw1, got.dw1), Diff("dw2", ref.dw2, got.dw2)};
}

int64_t DroppedChoices(const LayerResults& r) {
  return std::count(r.slot.begin(), r.slot.end(), -1);
}

bool SameRouting(const LayerResults& ref, const LayerResults& got, int64_t top_k, bool slots) {
  const int64_t ref_n = static_cast<int64_t>(ref.expert.size()) / top_k;
  const int64_t got_n = static_cast<int64_t>(got.expert.size()) / top_k;
  const int64_t lo = std::max(ref.route_offset, got.route_offset);
  const int64_t hi = std::min(ref.route_offset + ref_n, got.route_offset + got_n);
  for (int64_t s = lo; s < hi; ++s) {
    for (int64_t j = 0; j < top_k; ++j) {
      const size_t a = static_cast<size_t>((s - ref.route_offset) * top_k + j);
      const size_t b = static_cast<size_t>((s - got.route_offset) * top_k + j);
      if (ref.expert[a] != got.expert[b]) return false;
      if (slots && ref.slot[a] != got.slot[b]) return false;
    }
  }
  return true;
}

}  // namespace moeplan::executor
