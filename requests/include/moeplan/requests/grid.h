// Layer grids (`moeplan sweep`, `validate --layers`, benchmarks): a grid of
// lists expanded into its configs.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "moeplan/v1/layer.pb.h"

namespace moeplan::requests {

// Expands a grid into its configs (cartesian product in field order). Checks that
// every list is non-empty and the product is at most `max_configs`.
absl::StatusOr<std::vector<v1::LayerConfig>> ExpandGrid(const v1::LayerGrid& grid,
                                                        size_t max_configs = 1'000'000);

}  // namespace moeplan::requests
