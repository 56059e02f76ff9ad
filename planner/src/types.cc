#include "moeplan/planner/types.h"

#include <cmath>
#include <cstdint>

#include "enum_names.h"

namespace moeplan::planner {

std::string_view ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kDefault:
      return "default";
    case Schedule::kS1:
      return "s1";
    case Schedule::kS2:
      return "s2";
  }
  return "unknown";
}

bool ParseSchedule(std::string_view name, Schedule* out) {
  return internal::ParseByName(name, kAllSchedules, ScheduleName, out);
}

std::string_view AllToAllAlgoName(AllToAllAlgo a) {
  switch (a) {
    case AllToAllAlgo::kHierarchical:
      return "2dh";
    case AllToAllAlgo::kDeepEp:
      return "deepep";
    case AllToAllAlgo::kAllGather:
      return "allgather";
    case AllToAllAlgo::kLinear:
      break;
  }
  return "linear";
}

bool ParseAllToAllAlgo(std::string_view name, AllToAllAlgo* out) {
  return internal::ParseByName(name, kAllAllToAllAlgos, AllToAllAlgoName, out);
}

int64_t Capacity(int64_t top_k, double capacity_factor, int64_t tokens, int64_t num_experts) {
  // Exact when f has at most 6 decimals (1.2, 1.25, 2.0, ...): f = F / 1e6 with
  // integer F, and ceil(k * F * S / (E * 1e6)) in 128-bit integers (k < 2^25,
  // F < 2^31, S < 2^32 after validation). Decimal literals such as 1.2 are not
  // exact in binary, so a double product k*f*S would land just above an integer.
  // f qualifies only if it *is* the double nearest to F / 1e6 (what parsing the
  // decimal yields), not merely close to it.
  const double rounded = std::nearbyint(capacity_factor * 1e6);
  if (rounded > 0 && rounded < 4e18 && rounded / 1e6 == capacity_factor) {
    const __int128 num = static_cast<__int128>(top_k) * static_cast<int64_t>(rounded) * tokens;
    const __int128 den = static_cast<__int128>(num_experts) * 1000000;
    const __int128 cap = (num + den - 1) / den;
    return cap > INT64_MAX ? INT64_MAX : static_cast<int64_t>(cap);
  }
  // Other factors: long double with a slack of one double ulp of f.
  const long double want = static_cast<long double>(top_k) * capacity_factor *
                           static_cast<long double>(tokens) / static_cast<long double>(num_experts);
  return static_cast<int64_t>(std::ceil(want * (1.0L - 1.2e-16L)));
}

DerivedShape Derive(const LayerConfig& layer) {
  DerivedShape d;
  d.tokens = layer.batch_size * layer.seq_len;
  d.capacity = RouteCapacity(layer, d.tokens);
  d.activation_bytes = d.tokens * layer.model_dim * layer.bytes_per_element;
  d.dispatch_bytes = layer.num_experts * d.capacity * layer.model_dim * layer.bytes_per_element;
  return d;
}

int64_t RouteCapacity(const LayerConfig& layer, int64_t tokens) {
  return Capacity(layer.top_k, layer.dropless ? 1.0 : layer.capacity_factor, tokens,
                  layer.num_experts);
}

double ExpertSkew(const LayerConfig& layer) { return layer.dropless ? layer.token_skew : 1.0; }

double DroppedShare(const LayerConfig& layer) {
  if (layer.dropless || layer.token_skew <= layer.capacity_factor) return 0.0;
  return 1.0 - layer.capacity_factor / layer.token_skew;
}

}  // namespace moeplan::planner
