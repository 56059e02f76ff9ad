#include "moeplan/planner/types.h"

#include <cmath>

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
  for (Schedule s : kAllSchedules) {
    if (ScheduleName(s) == name) {
      *out = s;
      return true;
    }
  }
  return false;
}

int64_t Capacity(int64_t top_k, double capacity_factor, int64_t tokens, int64_t num_experts) {
  const double want = static_cast<double>(top_k) * capacity_factor * static_cast<double>(tokens) /
                      static_cast<double>(num_experts);
  return static_cast<int64_t>(std::ceil(want * (1.0 - 1e-12)));
}

DerivedShape Derive(const LayerConfig& layer) {
  DerivedShape d;
  d.tokens = layer.batch_size * layer.seq_len;
  d.capacity = Capacity(layer.top_k, layer.capacity_factor, d.tokens, layer.num_experts);
  d.activation_bytes = d.tokens * layer.model_dim * layer.bytes_per_element;
  d.dispatch_bytes = layer.num_experts * d.capacity * layer.model_dim * layer.bytes_per_element;
  return d;
}

}  // namespace moeplan::planner
